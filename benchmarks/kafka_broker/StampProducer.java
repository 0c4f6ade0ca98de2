// The Kafka side of benchmarks/kafka.py's latency figure: a plain producer outside Spark (linger
// 0) sending one 116-byte message every interval: the wall-clock time in ns as 20 ASCII digits,
// then a kind byte (W: warm-up, M: measured), then zeros -- the stamp source_latency.py writes.
// Run with the single-file launcher: java -cp <kafka-clients...> StampProducer.java ARGS
// ARGS: bootstrap topic warmupMessages measuredMessages intervalMs
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class StampProducer {
    static byte[] stamp(char kind) {
        Instant now = Instant.now();
        long ns = now.getEpochSecond() * 1_000_000_000L + now.getNano();
        byte[] value = new byte[116];
        byte[] head = String.format("%020d%c", ns, kind).getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(head, 0, value, 0, head.length);
        return value;
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("linger.ms", "0");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        int warmup = Integer.parseInt(args[2]);
        int measured = Integer.parseInt(args[3]);
        long interval = Long.parseLong(args[4]);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < warmup + measured; i++) {
                char kind = i < warmup ? 'W' : 'M';
                producer.send(new ProducerRecord<byte[], byte[]>(args[1], stamp(kind))).get();
                Thread.sleep(interval);
            }
        }
        System.out.println("sent " + (warmup + measured));
    }
}
