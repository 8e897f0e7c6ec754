package io.sluice.compare.model;

/** A person who registers to sell or bid (bench/nexmark/model.h Person). Times are ms since epoch. */
public class Person {
  public long id;
  public String name;
  public String emailAddress;
  public String creditCard;
  public String city;
  public String state;
  public long dateTime;
  public String extra;

  public Person() {}
}
