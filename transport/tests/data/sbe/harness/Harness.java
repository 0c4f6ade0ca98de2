// aeron-spark golden tests: encodes token lines into SBE messages with the SbeTool-generated
// Java codecs, and decodes messages into token lines.
//   java Harness v1|be|venue encode <Message> < tokens > messages
//   java Harness v1|be|venue decode <Message> < messages > tokens
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

public final class Harness
{
    public static void main(final String[] args) throws Exception
    {
        final String schema = args[0];
        final String mode = args[1];
        final String message = args[2];
        if (mode.equals("encode"))
        {
            final BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
            final ByteArrayOutputStream out = new ByteArrayOutputStream();
            final byte[] buffer = new byte[1 << 20];
            String line;
            while ((line = in.readLine()) != null)
            {
                final Tokens tokens = new Tokens(line);
                final int length = schema.equals("v1") ? V1Codecs.encode(message, tokens, buffer)
                    : schema.equals("venue") ? VenueCodecs.encode(message, tokens, buffer)
                    : BeCodecs.encode(message, tokens, buffer);
                Tokens.writeMessage(out, buffer, length);
            }
            System.out.write(out.toByteArray());
            System.out.flush();
        }
        else
        {
            final PrintStream out = new PrintStream(System.out, false, "US-ASCII");
            for (final byte[] bytes : Tokens.readMessages(System.in))
            {
                final Tokens t = new Tokens();
                if (schema.equals("v1"))
                {
                    V1Codecs.decode(message, bytes, t);
                }
                else if (schema.equals("venue"))
                {
                    VenueCodecs.decode(message, bytes, t);
                }
                else
                {
                    BeCodecs.decode(message, bytes, t);
                }
                out.println(t.line());
            }
            out.flush();
        }
    }
}
