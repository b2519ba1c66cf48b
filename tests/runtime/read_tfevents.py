#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for the tests of runtime/observability:
TensorBoard is not in Debian, so this reads the format as TensorBoard's own reader does
(tensorboard/backend/event_processing/event_file_loader.py with tf_record.py's checks).

Each record: uint64 length, uint32 masked CRC-32C of the length, the data, uint32 masked CRC-32C
of the data (little-endian). The data is a tensorflow Event (event.proto): wall_time = 1 (double),
step = 2 (int64), file_version = 3 (string), summary = 5 (Summary: repeated Value value = 1;
Value: tag = 1, simple_value = 2 (float)). The CRC is computed here, bit by bit, from the
Castagnoli polynomial; the messages are decoded from the wire format by hand and, where Debian's
python3-protobuf is installed, a second time by Protobuf's own parser over descriptors built
here from tensorflow's field numbers (not from our .proto).

usage: read_tfevents.py FILE   prints one line per value: "STEP TAG VALUE" (VALUE as %.9g),
after a first line "version brain.Event:2". Exit 1 with a message on any malformed byte.
"""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, pos):
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise ValueError(f"wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def decode_event(data):
    event = {"wall_time": None, "step": 0, "version": None, "values": []}
    for number, wire, value in fields(data):
        if number == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            event["version"] = value.decode()
        elif number == 5 and wire == 2:
            for n, w, v in fields(value):
                if n != 1 or w != 2:
                    raise ValueError("Summary holds something else than values")
                tag, simple = None, None
                for vn, vw, vv in fields(v):
                    if vn == 1 and vw == 2:
                        tag = vv.decode()
                    elif vn == 2 and vw == 5:
                        simple = struct.unpack("<f", vv)[0]
                if tag is None or simple is None:
                    raise ValueError("a Summary.Value without tag or simple_value")
                event["values"].append((tag, simple))
        else:
            raise ValueError(f"unexpected Event field {number}")
    return event


def protobuf_parser():
    """Event's class from Protobuf's runtime over descriptors built from tensorflow's numbers."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        return None
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="tf_event_check.proto", package="tfcheck",
                                           syntax="proto3")
    summary = f.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tfcheck.Summary.Value")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tfcheck.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(
        pool.FindMessageTypeByName("tfcheck.Event"))


def main():
    data = open(sys.argv[1], "rb").read()
    Event = protobuf_parser()
    pos, lines = 0, []
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked(header) != length_crc:
            raise ValueError(f"length CRC mismatch at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise ValueError(f"truncated record at byte {pos}")
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if masked(body) != data_crc:
            raise ValueError(f"data CRC mismatch at byte {pos}")
        pos += 16 + length
        event = decode_event(body)
        if event["wall_time"] is None or event["wall_time"] < 1e9:
            raise ValueError("an event without a plausible wall_time")
        if Event is not None:
            parsed = Event()
            parsed.ParseFromString(body)
            again = [(v.tag, v.simple_value) for v in parsed.summary.value]
            if again != event["values"] or parsed.step != event["step"] or (
                    event["version"] is not None and parsed.file_version != event["version"]):
                raise ValueError("Protobuf's parser reads the event otherwise")
        if event["version"] is not None:
            lines.append(f"version {event['version']}")
        for tag, value in event["values"]:
            lines.append(f"{event['step']} {tag} {value:.9g}")
    print("parser protobuf" if Event is not None else "parser raw")
    print("\n".join(lines))


if __name__ == "__main__":
    try:
        main()
    except (ValueError, UnicodeDecodeError) as e:
        print(f"read_tfevents: {e}", file=sys.stderr)
        sys.exit(1)
