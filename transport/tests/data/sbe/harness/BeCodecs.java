// Token <-> message for golden-be.xml (package golden.be, big-endian), fields in schema order.
import golden.be.*;
import org.agrona.concurrent.UnsafeBuffer;

final class BeCodecs
{
    static int encode(final String message, final Tokens t, final byte[] bytes)
    {
        final UnsafeBuffer buffer = new UnsafeBuffer(bytes);
        final QuoteEncoder e = new QuoteEncoder().wrapAndApplyHeader(buffer, 0, new HeaderEncoder());
        e.bid().mantissa(t.i()).exponent((byte)t.i());
        e.ask().mantissa(t.i()).exponent((byte)t.i());
        e.size(t.i()).putSymbol(t.x(5), 0).side(Side.get((byte)t.i()));
        e.flags().clear().a(t.b()).b(t.b()).c(t.b());
        e.big(t.u()).f(t.f()).d(t.d());
        final int levelCount = (int)t.i();
        final QuoteEncoder.LevelsEncoder levels = e.levelsCount(levelCount);
        for (int n = levelCount; n > 0; n--)
        {
            levels.next().px(t.i()).qty((int)t.i());
        }
        final byte[] note = t.x();
        e.putNote(note, 0, note.length);
        return HeaderEncoder.ENCODED_LENGTH + e.encodedLength();
    }

    static void decode(final String message, final byte[] bytes, final Tokens t)
    {
        final QuoteDecoder d = new QuoteDecoder().wrapAndApplyHeader(
            new UnsafeBuffer(bytes), 0, new HeaderDecoder());
        t.put(d.bid().mantissa()).put(d.bid().exponent()).put(d.ask().mantissa()).put(d.ask().exponent());
        final byte[] symbol = new byte[5];
        d.getSymbol(symbol, 0);
        t.put(d.size()).putChars(symbol).put(d.sideRaw());
        t.putB(d.flags().a()).putB(d.flags().b()).putB(d.flags().c());
        t.putU(d.big()).putF(d.f()).putD(d.d());
        final QuoteDecoder.LevelsDecoder levels = d.levels();
        t.put(levels.count());
        for (final QuoteDecoder.LevelsDecoder level : levels)
        {
            t.put(level.px()).put(level.qty());
        }
        final byte[] note = new byte[d.noteLength()];
        d.getNote(note, 0, note.length);
        t.putX(note, note.length);
    }
}
