package io.sluice.compare.kafka;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectReader;
import io.sluice.compare.model.Bid;
import java.io.IOException;
import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;

/**
 * Reads a Kafka value written by {@code sluice-bench nexmark-kafka-fill} (a bid as a JSON object) into a {@link
 * Bid} with Jackson data binding. One {@link ObjectReader} per source subtask, made in {@link #open}, is reused
 * for every record (the idiomatic fast path: readers are immutable and cache their deserializers).
 */
public class BidJsonDeserializationSchema implements DeserializationSchema<Bid> {
  private static final long serialVersionUID = 1L;

  private transient ObjectReader reader;

  @Override
  public void open(InitializationContext context) {
    // Unknown fields are skipped, as on the Sluice side; a missing field keeps its default.
    reader =
        new ObjectMapper()
            .disable(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES)
            .readerFor(Bid.class);
  }

  @Override
  public Bid deserialize(byte[] message) throws IOException {
    return reader.readValue(message);
  }

  @Override
  public boolean isEndOfStream(Bid nextElement) {
    return false;
  }

  @Override
  public TypeInformation<Bid> getProducedType() {
    return TypeInformation.of(Bid.class);
  }
}
