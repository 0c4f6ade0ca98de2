// aeron-spark interop test: decodes SBE messages of any schema with SbeTool's on-the-fly decoder
// (the schema's IR, no generated code) and prints each as one line of the golden harness's tokens
// (fields in schema order, constants left out; integers in decimal, floats as their raw IEEE bits,
// chars and var data as "x" + hex, set choices as 0/1, a group as its count then its entries).
//   java OtfDump schema.xml < length-prefixed messages > token lines
import java.io.FileInputStream;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.ByteOrder;
import java.util.List;
import org.agrona.DirectBuffer;
import org.agrona.concurrent.UnsafeBuffer;
import uk.co.real_logic.sbe.PrimitiveType;
import uk.co.real_logic.sbe.ir.Encoding;
import uk.co.real_logic.sbe.ir.Ir;
import uk.co.real_logic.sbe.xml.IrGenerator;
import uk.co.real_logic.sbe.ir.Token;
import uk.co.real_logic.sbe.otf.AbstractTokenListener;
import uk.co.real_logic.sbe.otf.OtfHeaderDecoder;
import uk.co.real_logic.sbe.otf.OtfMessageDecoder;
import uk.co.real_logic.sbe.xml.ParserOptions;
import uk.co.real_logic.sbe.xml.XmlSchemaParser;

public final class OtfDump extends AbstractTokenListener
{
    private final Tokens out = new Tokens();

    public static void main(final String[] args) throws Exception
    {
        final Ir ir;
        try (InputStream in = new FileInputStream(args[0]))
        {
            ir = new IrGenerator().generate(XmlSchemaParser.parse(
                in, ParserOptions.builder().stopOnError(true).xIncludeAware(true).build()));
        }
        final OtfHeaderDecoder header = new OtfHeaderDecoder(ir.headerStructure());
        final PrintStream print = new PrintStream(System.out, false, "US-ASCII");
        for (final byte[] bytes : Tokens.readMessages(System.in))
        {
            final UnsafeBuffer buffer = new UnsafeBuffer(bytes);
            final List<Token> tokens = ir.getMessage(header.getTemplateId(buffer, 0));
            final OtfDump dump = new OtfDump();
            OtfMessageDecoder.decode(
                buffer, header.encodedLength(), header.getSchemaVersion(buffer, 0),
                header.getBlockLength(buffer, 0), tokens, dump);
            print.println(dump.out.line());
        }
        print.flush();
    }

    private static boolean constant(final Token field, final Token type)
    {
        return field.isConstantEncoding() || type.isConstantEncoding();
    }

    public void onEncoding(
        final Token field, final DirectBuffer buffer, final int index, final Token type, final int version)
    {
        if (constant(field, type))
        {
            return;
        }
        final Encoding e = type.encoding();
        final int count = type.arrayLength();
        if (e.primitiveType() == PrimitiveType.CHAR)
        {
            final byte[] bytes = new byte[count];
            buffer.getBytes(index, bytes);
            out.putChars(bytes);
            return;
        }
        final int size = e.primitiveType().size();
        for (int k = 0; k < count; k++)
        {
            put(buffer, index + k * size, e.primitiveType(), e.byteOrder());
        }
    }

    public void onEnum(
        final Token field, final DirectBuffer buffer, final int index, final List<Token> tokens,
        final int from, final int to, final int version)
    {
        final Token type = tokens.get(from);
        if (!constant(field, type))
        {
            put(buffer, index, type.encoding().primitiveType(), type.encoding().byteOrder());
        }
    }

    public void onBitSet(
        final Token field, final DirectBuffer buffer, final int index, final List<Token> tokens,
        final int from, final int to, final int version)
    {
        final Encoding e = tokens.get(from).encoding();
        final long bits = raw(buffer, index, e.primitiveType(), e.byteOrder());
        for (int k = from + 1; k < to; k++)
        {
            out.putB(((bits >>> tokens.get(k).encoding().constValue().longValue()) & 1) != 0);
        }
    }

    public void onGroupHeader(final Token token, final int numInGroup)
    {
        out.put(numInGroup);
    }

    public void onVarData(
        final Token field, final DirectBuffer buffer, final int index, final int length, final Token type)
    {
        final byte[] bytes = new byte[length];
        buffer.getBytes(index, bytes);
        out.putX(bytes, length);
    }

    private static long raw(final DirectBuffer b, final int i, final PrimitiveType t, final ByteOrder o)
    {
        switch (t)
        {
            case CHAR: case INT8: return b.getByte(i);
            case UINT8: return b.getByte(i) & 0xFF;
            case INT16: return b.getShort(i, o);
            case UINT16: return b.getShort(i, o) & 0xFFFF;
            case INT32: return b.getInt(i, o);
            case UINT32: case FLOAT: return b.getInt(i, o) & 0xFFFF_FFFFL;
            default: return b.getLong(i, o);
        }
    }

    private void put(final DirectBuffer b, final int i, final PrimitiveType t, final ByteOrder o)
    {
        final long v = raw(b, i, t, o);
        if (t == PrimitiveType.UINT64 || t == PrimitiveType.DOUBLE)
        {
            out.putU(v);
        }
        else
        {
            out.put(v);
        }
    }
}
