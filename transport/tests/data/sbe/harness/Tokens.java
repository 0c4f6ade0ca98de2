// aeron-spark golden tests: one message per line of space-separated tokens (integers in decimal,
// floats as their raw IEEE bits in decimal, bytes as "x" + hex), and length-prefixed message files.
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;

final class Tokens
{
    private final String[] tokens;
    private int next;
    private final StringBuilder out = new StringBuilder();

    Tokens(final String line)
    {
        tokens = line.isEmpty() ? new String[0] : line.split(" ");
    }

    Tokens()
    {
        tokens = new String[0];
    }

    long i() { return Long.parseLong(tokens[next++]); }
    long u() { return Long.parseUnsignedLong(tokens[next++]); }
    float f() { return Float.intBitsToFloat((int)Long.parseLong(tokens[next++])); }
    double d() { return Double.longBitsToDouble(Long.parseUnsignedLong(tokens[next++])); }
    boolean b() { return tokens[next++].equals("1"); }

    byte[] x()
    {
        final String t = tokens[next++];
        final byte[] bytes = new byte[(t.length() - 1) / 2];
        for (int k = 0; k < bytes.length; k++)
        {
            bytes[k] = (byte)Integer.parseInt(t.substring(1 + 2 * k, 3 + 2 * k), 16);
        }
        return bytes;
    }

    byte[] x(final int width)
    {
        final byte[] bytes = x();
        final byte[] padded = new byte[width];
        System.arraycopy(bytes, 0, padded, 0, bytes.length);
        return padded;
    }

    Tokens put(final long v) { return word(Long.toString(v)); }
    Tokens putU(final long v) { return word(Long.toUnsignedString(v)); }
    Tokens putF(final float v) { return word(Long.toString(Float.floatToRawIntBits(v) & 0xFFFF_FFFFL)); }
    Tokens putD(final double v) { return word(Long.toUnsignedString(Double.doubleToRawLongBits(v))); }
    Tokens putB(final boolean v) { return word(v ? "1" : "0"); }

    Tokens putX(final byte[] bytes, final int length)
    {
        final StringBuilder sb = new StringBuilder("x");
        for (int k = 0; k < length && k < bytes.length; k++)
        {
            sb.append(String.format("%02x", bytes[k] & 0xFF));
        }
        return word(sb.toString());
    }

    Tokens putChars(final byte[] bytes)
    {
        int end = 0;
        while (end < bytes.length && bytes[end] != 0)
        {
            end++;
        }
        return putX(bytes, end);
    }

    private Tokens word(final String w)
    {
        if (out.length() > 0)
        {
            out.append(' ');
        }
        out.append(w);
        return this;
    }

    String line() { return out.toString(); }

    static List<byte[]> readMessages(final InputStream in) throws IOException
    {
        final List<byte[]> messages = new ArrayList<>();
        final DataInputStream data = new DataInputStream(in);
        final byte[] prefix = new byte[4];
        while (true)
        {
            try
            {
                data.readFully(prefix);
            }
            catch (final EOFException end)
            {
                return messages;
            }
            final int length = ByteBuffer.wrap(prefix).order(ByteOrder.LITTLE_ENDIAN).getInt();
            final byte[] message = new byte[length];
            data.readFully(message);
            messages.add(message);
        }
    }

    static void writeMessage(final ByteArrayOutputStream out, final byte[] bytes, final int length)
    {
        final byte[] prefix = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(length).array();
        out.write(prefix, 0, 4);
        out.write(bytes, 0, length);
    }
}
