"""SBE message schemas (the ``sbe:messageSchema`` XML that the real SbeTool reads) as layouts.

Parsed with the standard library's :mod:`xml.etree.ElementTree`, by hand: no well-kept Python
SBE library exists (the real-logic project generates Java, C++, C#, Go and Rust, not Python), and
what we need is not generated classes but each message's byte layout, which numpy then reads and
writes many messages at a time.

A message becomes a tree of :class:`Node` (leaves at absolute offsets in its root block), its
repeating :class:`Group` s (each with its own block and dimension header) and its var
:class:`Data` fields, in schema order. Composites and refs are flattened into struct nodes whose
leaves carry offsets from the start of the enclosing block.
"""

from __future__ import annotations

import math
import os
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, cast
from xml.etree import ElementInclude

from aeron_spark.transport.sbe.errors import SbeSchemaError, UnknownMessageError

# name -> (numpy kind+size, size in bytes, null value, min value, max value)
PRIMITIVES: dict[str, tuple[str, int, float, float, float]] = {
    "char": ("u1", 1, 0, 0x20, 0x7E),
    "int8": ("i1", 1, -(2**7), -(2**7) + 1, 2**7 - 1),
    "int16": ("i2", 2, -(2**15), -(2**15) + 1, 2**15 - 1),
    "int32": ("i4", 4, -(2**31), -(2**31) + 1, 2**31 - 1),
    "int64": ("i8", 8, -(2**63), -(2**63) + 1, 2**63 - 1),
    "uint8": ("u1", 1, 2**8 - 1, 0, 2**8 - 2),
    "uint16": ("u2", 2, 2**16 - 1, 0, 2**16 - 2),
    "uint32": ("u4", 4, 2**32 - 1, 0, 2**32 - 2),
    "uint64": ("u8", 8, 2**64 - 1, 0, 2**64 - 2),
    "float": ("f4", 4, math.nan, -math.inf, math.inf),
    "double": ("f8", 8, math.nan, -math.inf, math.inf),
}


@dataclass(frozen=True)
class Node:
    """One field (or composite member) at ``offset`` bytes into its block.

    ``kind``: ``scalar`` (a primitive or a primitive array: ``length`` > 1, or char arrays),
    ``enum``, ``set``, ``struct`` (a composite: ``children``). ``constant`` nodes take no bytes
    and hold ``const`` (the literal value, or the enum name for enum constants).
    """

    name: str
    kind: str
    primitive: str = "uint8"
    offset: int = 0
    length: int = 1
    optional: bool = False
    null_value: float = 0
    min_value: float = 0
    max_value: float = 0
    encoding: str | None = None  # char arrays: the character encoding
    since_version: int = 0
    deprecated: int | None = None
    constant: bool = False
    const: object = None
    values: tuple[tuple[str, int], ...] = ()  # enum valid values / set choices (name, bit)
    children: tuple[Node, ...] = ()

    @property
    def size(self) -> int:
        if self.constant:
            return 0
        if self.kind == "struct":
            return max((c.offset - self.offset + c.size for c in self.children), default=0)
        return PRIMITIVES[self.primitive][1] * self.length

    @property
    def is_string(self) -> bool:
        return self.kind == "scalar" and self.primitive == "char"

    def leaves(self) -> list[Node]:
        if self.kind == "struct":
            return [leaf for c in self.children for leaf in c.leaves()]
        return [self]


@dataclass(frozen=True)
class Data:
    """A variable-length data field: a length prefix then that many bytes."""

    name: str
    id: int
    length_primitive: str
    max_length: int
    string: bool
    encoding: str | None
    since_version: int = 0
    deprecated: int | None = None

    @property
    def prefix_size(self) -> int:
        return PRIMITIVES[self.length_primitive][1]


@dataclass(frozen=True)
class Block:
    """The fixed fields of a message or group entry, then its groups, then its var data."""

    name: str
    block_length: int
    fields: tuple[Node, ...]
    groups: tuple[Group, ...] = ()
    data: tuple[Data, ...] = ()

    @property
    def fixed(self) -> bool:
        return not self.groups and not self.data


@dataclass(frozen=True)
class Group(Block):
    id: int = 0
    dimension: Node = field(default_factory=lambda: Node("", "struct"))
    since_version: int = 0
    deprecated: int | None = None

    @property
    def count_leaf(self) -> Node:
        return _member(self.dimension, "numInGroup")

    @property
    def block_length_leaf(self) -> Node:
        return _member(self.dimension, "blockLength")


@dataclass(frozen=True)
class Message(Block):
    id: int = 0
    since_version: int = 0
    deprecated: int | None = None


@dataclass(frozen=True)
class Schema:
    package: str
    id: int
    version: int
    byte_order: str  # "<" or ">"
    header: Node
    messages: tuple[Message, ...]

    @property
    def header_length(self) -> int:
        return self.header.size

    def message(self, key: str | int) -> Message:
        """The message named ``key`` or with template id ``key`` (digits)."""
        text = str(key).strip()
        for m in self.messages:
            if m.name == text or (text.lstrip("-").isdigit() and m.id == int(text)):
                return m
        known = ", ".join(f"{m.name} ({m.id})" for m in self.messages)
        raise UnknownMessageError(f"the schema has no message {text!r} (it has {known})", name=text)


def _member(composite: Node, name: str) -> Node:
    for c in composite.children:
        if c.name == name:
            return c
    raise SbeSchemaError(f"composite {composite.name!r} has no member {name!r}", element=name)


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _int(el: ET.Element, attr: str, default: int | None = None) -> int | None:
    text = el.get(attr)
    if text is None or not text.strip():
        return default
    try:
        return int(text.strip())
    except ValueError:
        raise SbeSchemaError(
            f"<{_local(el.tag)} name={el.get('name')!r}>: {attr}={text!r} is not an integer",
            element=el.get("name"),
        ) from None


def _number(text: str, primitive: str) -> float:
    if primitive == "char":
        # a char value is one character, as in SbeTool: <validValue>0</validValue> is '0' (0x30)
        one = text if len(text) == 1 else text.strip()
        if len(one) != 1 or ord(one) > 0x7F:
            raise SbeSchemaError(f"{text!r} is not a char value (one ASCII character)", value=text)
        return ord(one)
    try:
        return float(text) if primitive in ("float", "double") else int(text.strip(), 0)
    except ValueError:
        raise SbeSchemaError(f"{text!r} is not a {primitive} value", value=text) from None


class _Parser:
    def __init__(self, root: ET.Element) -> None:
        self.root = root
        self.types: dict[str, ET.Element] = {}
        for types in root:
            if _local(types.tag) != "types":
                continue
            for el in types:
                name = el.get("name")
                if name is None:
                    raise SbeSchemaError(f"a <{_local(el.tag)}> without a name", element=None)
                if name in self.types:
                    raise SbeSchemaError(f"type {name!r} is defined twice", element=name)
                self.types[name] = el

    # --- types -----------------------------------------------------------------------------

    def node(
        self,
        type_name: str,
        name: str,
        offset: int,
        since: int,
        deprecated: int | None,
        presence: str | None = None,
        value_ref: str | None = None,
        stack: tuple[str, ...] = (),
    ) -> Node:
        if type_name in stack:
            raise SbeSchemaError(f"type {type_name!r} contains itself", element=type_name)
        if type_name in PRIMITIVES and type_name not in self.types:
            return self._scalar(None, type_name, name, offset, since, deprecated, presence)
        el = self.types.get(type_name)
        if el is None:
            raise SbeSchemaError(f"field {name!r}: unknown type {type_name!r}", element=name)
        return self.element(
            el, name, offset, since, deprecated, presence, value_ref, (*stack, type_name)
        )

    def element(
        self,
        el: ET.Element,
        name: str,
        offset: int,
        since: int,
        deprecated: int | None,
        presence: str | None = None,
        value_ref: str | None = None,
        stack: tuple[str, ...] = (),
    ) -> Node:
        tag = _local(el.tag)
        since = max(since, _int(el, "sinceVersion", 0) or 0)
        if deprecated is None:
            deprecated = _int(el, "deprecated")
        if tag == "type":
            return self._scalar(
                el, el.get("primitiveType", ""), name, offset, since, deprecated, presence
            )
        if tag == "enum":
            return self._enum(el, name, offset, since, deprecated, presence, value_ref)
        if tag == "set":
            prim = self._encoding(el, name, "set")
            if prim not in ("uint8", "uint16", "uint32", "uint64"):
                raise SbeSchemaError(
                    f"set {name!r}: bad encodingType {el.get('encodingType')!r} "
                    "(a set is encoded as uint8, uint16, uint32 or uint64)",
                    element=name,
                )
            choices = tuple((c.get("name", ""), int((c.text or "").strip())) for c in el)
            return Node(
                name,
                "set",
                prim,
                offset,
                since_version=since,
                deprecated=deprecated,
                values=choices,
            )
        if tag == "composite":
            children: list[Node] = []
            at = offset
            for member in el:
                mtag = _local(member.tag)
                mname = member.get("name", "")
                moff = _int(member, "offset")
                if moff is not None:
                    at = offset + moff
                if mtag == "ref":
                    child = self.node(
                        member.get("type", ""), mname, at, since, deprecated, stack=stack
                    )
                    msince = _int(member, "sinceVersion", 0) or 0
                    if msince > child.since_version:
                        child = _with(child, since_version=msince)
                elif mtag in ("type", "enum", "set", "composite"):
                    child = self.element(member, mname, at, since, deprecated, stack=stack)
                else:
                    continue
                children.append(child)
                at += child.size
            return Node(
                name,
                "struct",
                offset=offset,
                since_version=since,
                deprecated=deprecated,
                children=tuple(children),
            )
        raise SbeSchemaError(f"type {name!r}: unknown element <{tag}>", element=name)

    def _scalar(
        self,
        el: ET.Element | None,
        prim: str,
        name: str,
        offset: int,
        since: int,
        deprecated: int | None,
        presence: str | None,
    ) -> Node:
        if prim not in PRIMITIVES:
            raise SbeSchemaError(f"{name!r}: unknown primitiveType {prim!r}", element=name)
        _, _, null, low, high = PRIMITIVES[prim]
        attrs = el.attrib if el is not None else {}
        length = int(attrs.get("length", "1"))
        own = attrs.get("presence", "required")
        presence = presence if presence in ("optional", "constant") else own
        if "nullValue" in attrs:
            null = _number(attrs["nullValue"], prim)
        if "minValue" in attrs:
            low = _number(attrs["minValue"], prim)
        if "maxValue" in attrs:
            high = _number(attrs["maxValue"], prim)
        encoding = attrs.get("characterEncoding")
        if prim == "char" and encoding is None:
            encoding = "US-ASCII"
        const = None
        if presence == "constant":
            text = (el.text or "") if el is not None else ""
            const = text if prim == "char" else _number(text, prim)
        return Node(
            name,
            "scalar",
            prim,
            offset,
            length,
            presence == "optional",
            null,
            low,
            high,
            encoding,
            since,
            deprecated,
            presence == "constant",
            const,
        )

    def _encoding(self, el: ET.Element, name: str, what: str) -> str:
        """The primitive of an enum's or set's ``encodingType``: a primitive, or the name of a
        ``<type>`` (whose primitiveType it takes)."""
        prim = el.get("encodingType", "")
        if prim in PRIMITIVES and prim not in self.types:
            return prim
        inner = self.types.get(prim)
        if inner is None or _local(inner.tag) != "type":
            raise SbeSchemaError(
                f"{what} {name!r}: bad encodingType {prim!r} (neither a primitive type nor the "
                "name of a <type>)",
                element=name,
            )
        return inner.get("primitiveType", "")

    def _enum(
        self,
        el: ET.Element,
        name: str,
        offset: int,
        since: int,
        deprecated: int | None,
        presence: str | None,
        value_ref: str | None,
    ) -> Node:
        prim = self._encoding(el, name, "enum")
        if prim not in ("char", "uint8", "int8", "uint16", "int16", "uint32", "int32"):
            raise SbeSchemaError(f"enum {name!r}: bad encodingType {prim!r}", element=name)
        values = tuple(
            (v.get("name", ""), int(_number(v.text or "", prim)))
            for v in el
            if _local(v.tag) == "validValue"
        )
        null_text = el.get("nullValue")
        null = _number(null_text, prim) if null_text else PRIMITIVES[prim][2]
        presence = presence or el.get("presence", "required")
        const = None
        if presence == "constant":
            ref = (value_ref or "").rpartition(".")[2]
            if ref not in dict(values):
                raise SbeSchemaError(
                    f"field {name!r}: valueRef {value_ref!r} names no value of "
                    f"enum {el.get('name')!r}",
                    element=name,
                )
            const = ref
        return Node(
            name,
            "enum",
            prim,
            offset,
            1,
            presence == "optional",
            null,
            since_version=since,
            deprecated=deprecated,
            constant=presence == "constant",
            const=const,
            values=values,
        )

    # --- messages ----------------------------------------------------------------------------

    def block(self, el: ET.Element, name: str, since: int) -> tuple[int, tuple, tuple, tuple]:
        fields: list[Node] = []
        groups: list[Group] = []
        data: list[Data] = []
        at = 0
        for child in el:
            tag = _local(child.tag)
            cname = child.get("name", "")
            csince = max(since, _int(child, "sinceVersion", 0) or 0)
            dep = _int(child, "deprecated")
            if tag == "field":
                if groups or data:
                    raise SbeSchemaError(
                        f"{name}: field {cname!r} after a group or data", element=cname
                    )
                off = _int(child, "offset")
                if off is not None:
                    if off < at:
                        raise SbeSchemaError(
                            f"{name}: field {cname!r} offset {off} overlaps the field before it",
                            element=cname,
                        )
                    at = off
                node = self.node(
                    child.get("type", ""),
                    cname,
                    at,
                    csince,
                    dep,
                    child.get("presence"),
                    child.get("valueRef"),
                )
                if (
                    child.get("presence") == "constant"
                    and node.kind == "scalar"
                    and (not node.constant)
                ):
                    raise SbeSchemaError(
                        f"{name}: constant field {cname!r} needs a constant type", element=cname
                    )
                fields.append(node)
                at += node.size
            elif tag == "group":
                if data:
                    raise SbeSchemaError(f"{name}: group {cname!r} after data", element=cname)
                groups.append(self.group(child, csince))
            elif tag == "data":
                data.append(self.data(child, csince))
        block_length = _int(el, "blockLength", at) or 0
        if block_length < at:
            raise SbeSchemaError(
                f"{name}: blockLength {block_length} is shorter than its fields ({at} bytes)",
                element=name,
            )
        return block_length, tuple(fields), tuple(groups), tuple(data)

    def group(self, el: ET.Element, since: int) -> Group:
        name = el.get("name", "")
        dim_name = el.get("dimensionType", "groupSizeEncoding")
        dimension = self.node(dim_name, dim_name, 0, 0, None)
        if dimension.kind != "struct":
            raise SbeSchemaError(
                f"group {name!r}: dimensionType {dim_name!r} is not a composite", element=name
            )
        bl, fields, groups, data = self.block(el, name, since)
        g = Group(
            name,
            bl,
            fields,
            groups,
            data,
            _int(el, "id", 0) or 0,
            dimension,
            since,
            _int(el, "deprecated"),
        )
        for leaf in (g.count_leaf, g.block_length_leaf):
            if leaf.kind != "scalar" or leaf.primitive in ("float", "double", "char"):
                raise SbeSchemaError(f"{dim_name}.{leaf.name} must be an integer", element=name)
        return g

    def data(self, el: ET.Element, since: int) -> Data:
        name = el.get("name", "")
        type_el = self.types.get(el.get("type", ""))
        if type_el is None or _local(type_el.tag) != "composite":
            raise SbeSchemaError(
                f"data {name!r}: type {el.get('type')!r} is not a composite", element=name
            )
        members = {m.get("name"): m for m in type_el}
        length, var = members.get("length"), members.get("varData")
        if length is None or var is None:
            raise SbeSchemaError(
                f"data {name!r}: {el.get('type')!r} needs members length and varData", element=name
            )
        lprim = length.get("primitiveType", "")
        if lprim not in ("uint8", "uint16", "uint32"):
            raise SbeSchemaError(
                f"data {name!r}: length must be uint8, uint16 or uint32", element=name
            )
        max_length = int(length.get("maxValue", str(PRIMITIVES[lprim][4])))
        if lprim == "uint32":
            max_length = min(max_length, 2**30)
        encoding = var.get("characterEncoding")
        string = encoding is not None or var.get("primitiveType") == "char"
        return Data(
            name,
            _int(el, "id", 0) or 0,
            lprim,
            max_length,
            string,
            encoding or ("US-ASCII" if string else None),
            since,
            _int(el, "deprecated"),
        )


def _with(node: Node, **changes: object) -> Node:
    from dataclasses import replace

    out = replace(node, **changes)  # type: ignore[arg-type]
    if "since_version" in changes and node.kind == "struct":
        since = int(changes["since_version"])  # type: ignore[call-overload]
        out = replace(
            out,
            children=tuple(
                _with(c, since_version=max(since, c.since_version)) for c in node.children
            ),
        )
    return out


XINCLUDE = "{http://www.w3.org/2001/XInclude}include"
MAX_INCLUDE_DEPTH = 6


def _xml(text: str, what: str) -> ET.Element:
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise SbeSchemaError(f"{what} is not well-formed XML: {exc}") from None


def _includes(root: ET.Element, path: str | None) -> None:
    """Resolve ``<xi:include href="...">`` in place, relative to the schema file ``path``; only
    files inside the schema's directory tree are read (an href outside it is refused)."""
    if not any(el.tag == XINCLUDE for el in root.iter()):
        return
    if path is None:
        href = next(el.get("href") for el in root.iter() if el.tag == XINCLUDE)
        raise SbeSchemaError(
            f"<xi:include href={href!r}>: includes are resolved relative to the schema file, so "
            "give the schema as a file path, not as XML text",
            path=href,
        )
    top = os.path.dirname(os.path.realpath(path))

    def load(href: str, parse: str, encoding: str | None = None) -> ET.Element | str:
        scheme = urllib.parse.urlsplit(href).scheme
        target = urllib.parse.unquote(urllib.parse.urlsplit(href).path) if scheme else href
        if scheme not in ("", "file") or parse != "xml":
            raise SbeSchemaError(
                f"<xi:include href={href!r} parse={parse!r}>: only XML files next to the schema "
                "can be included",
                path=href,
            )
        real = os.path.realpath(target)
        if os.path.commonpath([top, real]) != top:
            raise SbeSchemaError(
                f"<xi:include>: {real!r} is outside the schema's directory {top!r} (refused)",
                path=real,
            )
        try:
            with open(real, encoding=encoding or "utf-8") as f:
                return _xml(f.read(), f"the included file {real!r}")
        except OSError as exc:
            raise SbeSchemaError(f"<xi:include>: cannot read {real!r}: {exc}", path=real) from None

    try:
        ElementInclude.include(
            root,
            loader=cast(Any, load),  # typeshed's loader protocol is overloaded on parse=
            base_url=os.path.realpath(path),
            max_depth=MAX_INCLUDE_DEPTH,
        )
    except ElementInclude.LimitedRecursiveIncludeError:
        raise SbeSchemaError(
            f"<xi:include> nested deeper than {MAX_INCLUDE_DEPTH} levels", path=path
        ) from None
    except ElementInclude.FatalIncludeError as exc:
        raise SbeSchemaError(f"<xi:include>: {exc}", path=path) from None


def _root(source: str) -> ET.Element:
    """The schema's XML element tree (includes resolved), from XML text or a file's path."""
    text = source
    path = None
    if not source.lstrip().startswith("<"):
        path = os.path.expanduser(source.strip())
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise SbeSchemaError(
                f"cannot read the SBE schema file {path!r}: {exc}", path=path
            ) from None
    root = _xml(text, "the SBE schema")
    _includes(root, path)
    return root


def schema_text(source: str) -> str:
    """The schema as one XML text (its file read, its ``<xi:include>`` s resolved), for
    :func:`parse_schema` where the file and its includes cannot be read (Spark's executors)."""
    return ET.tostring(_root(source), encoding="unicode")


def parse_schema(source: str) -> Schema:
    """A schema from XML text, or from the path of an XML file (whose ``<xi:include>`` s are
    resolved relative to it)."""
    root = _root(source)
    if _local(root.tag) != "messageSchema":
        raise SbeSchemaError(
            f"the root element is <{_local(root.tag)}>, not <sbe:messageSchema>",
            element=_local(root.tag),
        )
    order = root.get("byteOrder", "littleEndian")
    if order not in ("littleEndian", "bigEndian"):
        raise SbeSchemaError(f"byteOrder {order!r}: expected littleEndian or bigEndian")
    p = _Parser(root)
    header_name = root.get("headerType", "messageHeader")
    header = p.node(header_name, header_name, 0, 0, None)
    for member in ("blockLength", "templateId", "schemaId", "version"):
        leaf = _member(header, member)
        if leaf.kind != "scalar" or leaf.primitive in ("float", "double", "char"):
            raise SbeSchemaError(f"{header_name}.{member} must be an integer", element=member)
    messages = []
    for el in root:
        if _local(el.tag) != "message":
            continue
        name = el.get("name", "")
        since = _int(el, "sinceVersion", 0) or 0
        bl, fields, groups, data = p.block(el, name, since)
        messages.append(
            Message(
                name,
                bl,
                fields,
                groups,
                data,
                _int(el, "id", 0) or 0,
                since,
                _int(el, "deprecated"),
            )
        )
    if not messages:
        raise SbeSchemaError("the schema defines no message")
    ids = [m.id for m in messages]
    if len(set(ids)) != len(ids):
        raise SbeSchemaError(f"template ids repeat: {sorted(ids)}")
    return Schema(
        root.get("package", ""),
        _int(root, "id", 0) or 0,
        _int(root, "version", 0) or 0,
        "<" if order == "littleEndian" else ">",
        header,
        tuple(messages),
    )


__all__ = [
    "Block",
    "Data",
    "Group",
    "Message",
    "Node",
    "PRIMITIVES",
    "Schema",
    "parse_schema",
    "schema_text",
]
