// Token <-> message for golden-v1.xml (package golden.v1), fields in schema order.
import golden.v1.*;
import org.agrona.concurrent.UnsafeBuffer;

final class V1Codecs
{
    static int encode(final String message, final Tokens t, final byte[] bytes)
    {
        final UnsafeBuffer buffer = new UnsafeBuffer(bytes);
        final MessageHeaderEncoder header = new MessageHeaderEncoder();
        if (message.equals("Tick"))
        {
            final TickEncoder e = new TickEncoder().wrapAndApplyHeader(buffer, 0, header);
            e.seq(t.u()).at(t.i());
            e.price().mantissa(t.i());
            e.qty((int)t.i()).side(Side.get((short)t.i())).putSymbol(t.x(8), 0);
            e.flags().clear().urgent(t.b()).hidden(t.b()).test(t.b());
            e.i8((byte)t.i()).u8((short)t.i()).i16((short)t.i()).u16((int)t.i()).u32(t.i()).f32(t.f());
            for (int k = 0; k < 4; k++)
            {
                e.levels(k, (short)t.i());
            }
            e.pct((short)t.i()).bidQty(t.i());
            e.booster().kind(Kind.get((byte)t.i())).power((short)t.i());
            e.refId(t.u()).oddLot((int)t.i()).legacy((short)t.i());
            e.mid(t.d()).putTag(t.x(6), 0).count(t.i());
            return MessageHeaderEncoder.ENCODED_LENGTH + e.encodedLength();
        }
        final OrderEncoder e = new OrderEncoder().wrapAndApplyHeader(buffer, 0, header);
        e.orderId(t.u()).side(Side.get((short)t.i())).limitPx(t.d()).clientId((int)t.i());
        final int legCount = (int)t.i();
        final OrderEncoder.LegsEncoder legs = e.legsCount(legCount);
        for (int n = legCount; n > 0; n--)
        {
            legs.next().legId(t.i()).qty(t.i()).side(Side.get((short)t.i()));
            legs.price().mantissa(t.i());
            legs.ratio(t.f());
            final int fillCount = (int)t.i();
            final OrderEncoder.LegsEncoder.FillsEncoder fills = legs.fillsCount(fillCount);
            for (int m = fillCount; m > 0; m--)
            {
                fills.next().fillQty((int)t.i()).fillPx(t.d());
            }
            final byte[] note = t.x();
            legs.putLegNote(note, 0, note.length);
        }
        final int tagCount = (int)t.i();
        final OrderEncoder.TagsEncoder tags = e.tagsCount(tagCount);
        for (int n = tagCount; n > 0; n--)
        {
            tags.next().code((int)t.i());
            tags.flags().clear().urgent(t.b()).hidden(t.b()).test(t.b());
        }
        final byte[] text = t.x();
        e.putText(text, 0, text.length);
        final byte[] blob = t.x();
        e.putBlob(blob, 0, blob.length);
        final byte[] comment = t.x();
        e.putComment(comment, 0, comment.length);
        return MessageHeaderEncoder.ENCODED_LENGTH + e.encodedLength();
    }

    static void decode(final String message, final byte[] bytes, final Tokens t)
    {
        final UnsafeBuffer buffer = new UnsafeBuffer(bytes);
        final MessageHeaderDecoder header = new MessageHeaderDecoder();
        if (message.equals("Tick"))
        {
            final TickDecoder d = new TickDecoder().wrapAndApplyHeader(buffer, 0, header);
            t.putU(d.seq()).put(d.at()).put(d.price().mantissa()).put(d.qty()).put(d.sideRaw());
            final byte[] symbol = new byte[8];
            d.getSymbol(symbol, 0);
            t.putChars(symbol);
            t.putB(d.flags().urgent()).putB(d.flags().hidden()).putB(d.flags().test());
            t.put(d.i8()).put(d.u8()).put(d.i16()).put(d.u16()).put(d.u32()).putF(d.f32());
            for (int k = 0; k < 4; k++)
            {
                t.put(d.levels(k));
            }
            t.put(d.pct()).put(d.bidQty()).put(d.booster().kindRaw()).put(d.booster().power());
            t.putU(d.refId()).put(d.oddLot()).put(d.legacy()).putD(d.mid());
            final byte[] tag = new byte[6];
            if (d.actingVersion() >= 1)
            {
                d.getTag(tag, 0);
            }
            t.putChars(tag).put(d.count());
            return;
        }
        final OrderDecoder d = new OrderDecoder().wrapAndApplyHeader(buffer, 0, header);
        t.putU(d.orderId()).put(d.sideRaw()).putD(d.limitPx()).put(d.clientId());
        final OrderDecoder.LegsDecoder legs = d.legs();
        t.put(legs.count());
        for (final OrderDecoder.LegsDecoder leg : legs)
        {
            t.put(leg.legId()).put(leg.qty()).put(leg.sideRaw()).put(leg.price().mantissa()).putF(leg.ratio());
            final OrderDecoder.LegsDecoder.FillsDecoder fills = leg.fills();
            t.put(fills.count());
            for (final OrderDecoder.LegsDecoder.FillsDecoder fill : fills)
            {
                t.put(fill.fillQty()).putD(fill.fillPx());
            }
            final byte[] note = new byte[leg.legNoteLength()];
            leg.getLegNote(note, 0, note.length);
            t.putX(note, note.length);
        }
        final OrderDecoder.TagsDecoder tags = d.tags();
        t.put(tags.count());
        for (final OrderDecoder.TagsDecoder tag : tags)
        {
            t.put(tag.code()).putB(tag.flags().urgent()).putB(tag.flags().hidden()).putB(tag.flags().test());
        }
        final byte[] text = new byte[d.textLength()];
        d.getText(text, 0, text.length);
        t.putX(text, text.length);
        final byte[] blob = new byte[d.blobLength()];
        d.getBlob(blob, 0, blob.length);
        t.putX(blob, blob.length);
        final byte[] comment = new byte[d.commentLength()];
        d.getComment(comment, 0, comment.length);
        t.putX(comment, comment.length);
    }
}
