#!/usr/bin/env python3
"""Checks a browser's screenshot of a cxxlaunch report.html: a PNG decoded here (zlib and the
five PNG filters, standard library only), then counted: the page is not blank (enough pixels
that are not the background), and the plots' line colour (#1f77b4) covers at least MIN pixels.

usage: check_screenshot.py PNG MIN_PLOT_PIXELS
prints "WIDTHxHEIGHT ink=N plot=M"; exit 0 when the page and its plots are there, 1 otherwise.
"""
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(line)
        prev = line
    return width, height, channels, rows


def main():
    width, height, channels, rows = decode(sys.argv[1])
    minimum = int(sys.argv[2])
    ink = plot = 0
    for line in rows:
        for x in range(0, width * channels, channels):
            r, g, b = line[x], line[x + 1], line[x + 2]
            if r < 235 or g < 235 or b < 235:
                ink += 1
            if abs(r - 0x1F) < 40 and abs(g - 0x77) < 40 and abs(b - 0xB4) < 40 and b > r + 60:
                plot += 1
    print(f"{width}x{height} ink={ink} plot={plot}")
    return 0 if ink > width * height // 100 and plot >= minimum else 1


if __name__ == "__main__":
    sys.exit(main())
