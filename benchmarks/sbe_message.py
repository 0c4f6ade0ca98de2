"""The SBE benchmark message: a ~100-byte fixed message of 15 fields (integers, prices as a
composite, a char[8] symbol, an enum), 103 bytes with its header. Shared by the source and sink
benchmarks (the ``sbe`` contender)."""

from __future__ import annotations

SCHEMA_XML = """<?xml version="1.0" encoding="UTF-8"?>
<sbe:messageSchema xmlns:sbe="http://fixprotocol.io/2016/sbe" package="bench" id="77"
                   version="0" byteOrder="littleEndian">
    <types>
        <composite name="messageHeader">
            <type name="blockLength" primitiveType="uint16"/>
            <type name="templateId" primitiveType="uint16"/>
            <type name="schemaId" primitiveType="uint16"/>
            <type name="version" primitiveType="uint16"/>
        </composite>
        <composite name="Price">
            <type name="mantissa" primitiveType="int64"/>
            <type name="exponent" primitiveType="int8"/>
        </composite>
        <type name="Symbol" primitiveType="char" length="8"/>
        <enum name="Side" encodingType="uint8">
            <validValue name="BUY">1</validValue>
            <validValue name="SELL">2</validValue>
        </enum>
    </types>
    <sbe:message name="Trade" id="1">
        <field name="seq" id="1" type="int64"/>
        <field name="at" id="2" type="int64"/>
        <field name="price" id="3" type="Price"/>
        <field name="qty" id="4" type="int64"/>
        <field name="side" id="5" type="Side"/>
        <field name="symbol" id="6" type="Symbol"/>
        <field name="venue" id="7" type="int16"/>
        <field name="trader" id="8" type="int32"/>
        <field name="orderId" id="9" type="int64"/>
        <field name="bid" id="10" type="Price"/>
        <field name="ask" id="11" type="Price"/>
        <field name="flags" id="12" type="int8"/>
        <field name="tradeId" id="13" type="int64"/>
        <field name="settle" id="14" type="int32"/>
        <field name="notional" id="15" type="int64"/>
    </sbe:message>
</sbe:messageSchema>
"""

# The same columns from Spark SQL (for the sink: a rate source's `value` spread over the fields).
SELECT = [
    "value as seq",
    "value * 1000 as at",
    "named_struct('mantissa', value * 7, 'exponent', cast(-4 as tinyint)) as price",
    "value % 1000 as qty",
    "if(value % 2 = 0, 'BUY', 'SELL') as side",
    "concat('SYM', cast(value % 10000 as string)) as symbol",
    "cast(value % 30 as smallint) as venue",
    "cast(value % 100000 as int) as trader",
    "value * 3 as orderId",
    "named_struct('mantissa', value * 7 - 1, 'exponent', cast(-4 as tinyint)) as bid",
    "named_struct('mantissa', value * 7 + 1, 'exponent', cast(-4 as tinyint)) as ask",
    "cast(value % 8 as tinyint) as flags",
    "value * 5 as tradeId",
    "cast(value % 3 as int) as settle",
    "value * 11 as notional",
]


def codec():  # type: ignore[no-untyped-def]
    from aeron_spark.transport import sbe

    return sbe.load(SCHEMA_XML, "Trade")


def table(rows: int):  # type: ignore[no-untyped-def]
    """``rows`` rows of the message's columns (vectorised)."""
    import numpy as np
    import pyarrow as pa

    v = np.arange(rows, dtype=np.int64)

    def price(m: np.ndarray) -> pa.Array:
        return pa.StructArray.from_arrays(
            [pa.array(m), pa.array(np.full(rows, -4, np.int8))], names=["mantissa", "exponent"]
        )

    sym = pa.array(np.char.add("SYM", (v % 10000).astype(str)).astype(object), pa.string())
    side = pa.array(np.where(v % 2 == 0, "BUY", "SELL").astype(object), pa.string())
    return pa.table(
        {
            "seq": v,
            "at": v * 1000,
            "price": price(v * 7),
            "qty": v % 1000,
            "side": side,
            "symbol": sym,
            "venue": (v % 30).astype(np.int16),
            "trader": (v % 100000).astype(np.int32),
            "orderId": v * 3,
            "bid": price(v * 7 - 1),
            "ask": price(v * 7 + 1),
            "flags": (v % 8).astype(np.int8),
            "tradeId": v * 5,
            "settle": (v % 3).astype(np.int32),
            "notional": v * 11,
        }
    )
