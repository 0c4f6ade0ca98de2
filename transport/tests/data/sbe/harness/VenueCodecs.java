// Token <-> message for golden-venue.xml (package golden.venue), fields in schema order. Enums
// are set from their raw values with get(), so a null value token is Java's NULL_VAL.
import golden.venue.*;
import org.agrona.concurrent.UnsafeBuffer;

final class VenueCodecs
{
    static int encode(final String message, final Tokens t, final byte[] bytes)
    {
        final UnsafeBuffer buffer = new UnsafeBuffer(bytes);
        final ExecEncoder e = new ExecEncoder().wrapAndApplyHeader(buffer, 0, new MessageHeaderEncoder());
        e.seq(t.i()).side(SideCode.get((byte)t.i())).tif(TimeInForce.get((byte)t.i()));
        e.matchEvent().clear().lastTradeMsg(t.b()).lastVolumeMsg(t.b()).endOfEvent(t.b());
        e.aggressor(BooleanFlag.get((short)t.i())).reason(Reason.get((int)t.i()));
        e.settl().clear().isFinal(t.b()).actual(t.b()).rounded(t.b());
        e.qty((int)t.i());
        final int count = (int)t.i();
        final ExecEncoder.EntriesEncoder entries = e.entriesCount(count);
        for (int n = count; n > 0; n--)
        {
            entries.next().entryType(EntryType.get((byte)t.i())).px(t.i());
            entries.flags().clear().lastTradeMsg(t.b()).lastVolumeMsg(t.b()).endOfEvent(t.b());
            entries.implied(BooleanFlag.get((short)t.i()));
        }
        final byte[] text = t.x();
        e.putText(text, 0, text.length);
        return MessageHeaderEncoder.ENCODED_LENGTH + e.encodedLength();
    }

    static void decode(final String message, final byte[] bytes, final Tokens t)
    {
        final ExecDecoder d = new ExecDecoder().wrapAndApplyHeader(
            new UnsafeBuffer(bytes), 0, new MessageHeaderDecoder());
        t.put(d.seq()).put(d.sideRaw()).put(d.tifRaw());
        t.putB(d.matchEvent().lastTradeMsg()).putB(d.matchEvent().lastVolumeMsg())
            .putB(d.matchEvent().endOfEvent());
        t.put(d.aggressorRaw()).put(d.reasonRaw());
        t.putB(d.settl().isFinal()).putB(d.settl().actual()).putB(d.settl().rounded());
        t.put(d.qty());
        // the enums' get() as well: Java must know every value we wrote (or it throws)
        d.side();
        d.tif();
        d.aggressor();
        d.reason();
        final ExecDecoder.EntriesDecoder entries = d.entries();
        t.put(entries.count());
        for (final ExecDecoder.EntriesDecoder entry : entries)
        {
            entry.entryType();
            entry.implied();
            t.put(entry.entryTypeRaw()).put(entry.px());
            t.putB(entry.flags().lastTradeMsg()).putB(entry.flags().lastVolumeMsg())
                .putB(entry.flags().endOfEvent());
            t.put(entry.impliedRaw());
        }
        final byte[] text = new byte[d.textLength()];
        d.getText(text, 0, text.length);
        t.putX(text, text.length);
    }
}
