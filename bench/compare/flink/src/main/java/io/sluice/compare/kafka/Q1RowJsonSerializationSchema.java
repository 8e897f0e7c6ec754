package io.sluice.compare.kafka;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.StreamWriteFeature;
import com.fasterxml.jackson.databind.ObjectWriter;
import com.fasterxml.jackson.databind.json.JsonMapper;
import org.apache.flink.api.common.serialization.SerializationSchema;

/**
 * Writes a {@link Q1Row} as the JSON value {@code {"auction":..,"bidder":..,"price":..,"dateTime":..,"extra":..}}
 * with Jackson data binding; the price as a plain decimal (never in exponent notation). One {@link ObjectWriter}
 * per sink subtask, made in {@link #open}, is reused for every record.
 */
public class Q1RowJsonSerializationSchema implements SerializationSchema<Q1Row> {
  private static final long serialVersionUID = 1L;

  private transient ObjectWriter writer;

  @Override
  public void open(InitializationContext context) {
    writer =
        JsonMapper.builder()
            .enable(StreamWriteFeature.WRITE_BIGDECIMAL_AS_PLAIN)
            .build()
            .writerFor(Q1Row.class);
  }

  @Override
  public byte[] serialize(Q1Row row) {
    try {
      return writer.writeValueAsBytes(row);
    } catch (JsonProcessingException e) {
      throw new IllegalStateException("cannot write a query 1 row as JSON", e);
    }
  }
}
