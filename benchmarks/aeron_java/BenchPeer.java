// The real Aeron's side of benchmarks/lossy_link.py and benchmarks/real_subscriber.py: a publisher
// and a subscriber on the Aeron client API (io.aeron:aeron-all from Maven Central, never kept in
// this repository), each against a real Java media driver (aeron.dir from the system property),
// doing what testing_netns.transfer / real_subscriber do with ours.
//   pub CHANNEL STREAM SIZE SECONDS: offers SIZE-byte messages (first 8 bytes: the index, little
//     endian) for SECONDS as fast as flow control allows, prints {"offered":N,"start_ns":T}, then
//     keeps the publication open (retransmits) until its stdin closes.
//   pubn CHANNEL STREAM COUNT MAX_SIZE SEED: offers COUNT messages of 1..MAX_SIZE random bytes (the
//     sizes from xorshift64 seeded with SEED, as real_subscriber.sizes makes them; first 8 bytes
//     the index when there are 8), then as pub.
//   sub CHANNEL STREAM TIMEOUT_S: prints {"ready":true}, reads the expected count from stdin,
//     polls until it has that many messages (or TIMEOUT_S), prints what it received.
// Times are System.nanoTime (CLOCK_MONOTONIC: comparable across the two processes and namespaces).
import io.aeron.Aeron;
import io.aeron.FragmentAssembler;
import io.aeron.Publication;
import io.aeron.Subscription;
import io.aeron.logbuffer.FragmentHandler;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteOrder;
import java.util.concurrent.atomic.AtomicLong;
import org.agrona.BufferUtil;
import org.agrona.concurrent.BackoffIdleStrategy;
import org.agrona.concurrent.IdleStrategy;
import org.agrona.concurrent.UnsafeBuffer;

public class BenchPeer {
    public static void main(String[] args) throws Exception {
        try (Aeron aeron = Aeron.connect(new Aeron.Context())) {
            if (args[0].equals("pub")) {
                pub(aeron, args[1], Integer.parseInt(args[2]), Integer.parseInt(args[3]),
                    Double.parseDouble(args[4]));
            } else if (args[0].equals("pubn")) {
                pubn(aeron, args[1], Integer.parseInt(args[2]), Long.parseLong(args[3]),
                    Integer.parseInt(args[4]), Long.parseLong(args[5]));
            } else {
                sub(aeron, args[1], Integer.parseInt(args[2]), Double.parseDouble(args[3]));
            }
        }
    }

    /** Until a subscriber is connected to {@code pub} (at most 30 s). */
    static void awaitConnected(Publication pub) throws InterruptedException {
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (!pub.isConnected()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("the subscriber never connected");
            }
            Thread.sleep(1);
        }
    }

    static void pub(Aeron aeron, String channel, int stream, int size, double seconds)
        throws Exception {
        try (Publication pub = aeron.addPublication(channel, stream)) {
            awaitConnected(pub);
            UnsafeBuffer buffer = new UnsafeBuffer(BufferUtil.allocateDirectAligned(size, 64));
            IdleStrategy idle = new BackoffIdleStrategy();
            long start = System.nanoTime();
            long stop = start + (long) (seconds * 1e9);
            long offered = 0;
            while ((offered & 63) != 0 || System.nanoTime() < stop) {
                if (size >= 8) {
                    buffer.putLong(0, offered, ByteOrder.LITTLE_ENDIAN);
                }
                if (pub.offer(buffer, 0, size) > 0) {
                    offered++;
                    idle.reset();
                } else {
                    idle.idle();
                }
            }
            System.out.println("{\"offered\":" + offered + ",\"start_ns\":" + start + "}");
            System.out.flush();
            while (System.in.read() >= 0) {
                // linger: the subscriber may still be recovering losses
            }
        }
    }

    static void pubn(Aeron aeron, String channel, int stream, long count, int maxSize, long seed)
        throws Exception {
        try (Publication pub = aeron.addPublication(channel, stream)) {
            awaitConnected(pub);
            UnsafeBuffer buffer = new UnsafeBuffer(BufferUtil.allocateDirectAligned(maxSize, 64));
            java.util.Random random = new java.util.Random(seed);
            byte[] noise = new byte[maxSize];
            random.nextBytes(noise);
            buffer.putBytes(0, noise);
            IdleStrategy idle = new BackoffIdleStrategy();
            long x = seed;
            long start = System.nanoTime();
            for (long i = 0; i < count; i++) {
                x ^= x << 13;
                x ^= x >>> 7;
                x ^= x << 17;
                int size = 1 + (int) Long.remainderUnsigned(x, maxSize);
                if (size >= 8) {
                    buffer.putLong(0, i, ByteOrder.LITTLE_ENDIAN);
                }
                while (pub.offer(buffer, 0, size) <= 0) {
                    idle.idle();
                }
                idle.reset();
            }
            System.out.println("{\"offered\":" + count + ",\"start_ns\":" + start + "}");
            System.out.flush();
            while (System.in.read() >= 0) {
                // linger until told: the subscriber may still be reading
            }
        }
    }

    static void sub(Aeron aeron, String channel, int stream, double timeoutS) throws Exception {
        try (Subscription sub = aeron.addSubscription(channel, stream)) {
            long[] st = new long[5]; // next, bad, bytes, first_ns, last_ns
            FragmentHandler handler = new FragmentAssembler((buffer, offset, length, header) -> {
                if (length >= 8 && buffer.getLong(offset, ByteOrder.LITTLE_ENDIAN) != st[0]) {
                    st[1]++;
                }
                st[0]++;
                st[2] += length;
                long now = System.nanoTime();
                if (st[3] == 0) {
                    st[3] = now;
                }
                st[4] = now;
            });
            AtomicLong expected = new AtomicLong(-1);
            Thread reader = new Thread(() -> {
                try {
                    String line = new BufferedReader(new InputStreamReader(System.in)).readLine();
                    expected.set(line == null ? 0 : Long.parseLong(line.trim()));
                } catch (Exception e) {
                    expected.set(0);
                }
            });
            reader.setDaemon(true);
            reader.start();
            System.out.println("{\"ready\":true}");
            System.out.flush();
            IdleStrategy idle = new BackoffIdleStrategy();
            long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
            while (System.nanoTime() < deadline) {
                long want = expected.get();
                if (want >= 0 && st[0] >= want) {
                    break;
                }
                idle.idle(sub.poll(handler, 256));
            }
            System.out.println("{\"received\":" + st[0] + ",\"bad\":" + st[1] + ",\"bytes\":"
                + st[2] + ",\"first_ns\":" + st[3] + ",\"last_ns\":" + st[4] + "}");
            System.out.flush();
        }
    }
}
