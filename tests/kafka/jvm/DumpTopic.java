// Reads a whole topic with Kafka's own Java client (read_committed) and prints one
// line per record: partition, offset, key and value in Base64 ("-" for null).
// The Python tests compare what the JVM client sees with what microbatch wrote.
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class DumpTopic {
    private static String b64(byte[] bytes) {
        return bytes == null ? "-" : Base64.getEncoder().encodeToString(bytes);
    }

    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("isolation.level", "read_committed");
        props.put("enable.auto.commit", "false");
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(args[1], Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(args[1], info.partition()));
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            Map<TopicPartition, Long> end = consumer.endOffsets(parts, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline) {
                boolean done = true;
                for (TopicPartition tp : parts) {
                    if (consumer.position(tp, Duration.ofSeconds(30)) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    return;
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    System.out.println(r.partition() + "\t" + r.offset() + "\t" + b64(r.key())
                            + "\t" + b64(r.value()));
                }
            }
            System.err.println("timed out before the end offsets " + end);
            System.exit(3);
        }
    }
}
