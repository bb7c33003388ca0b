"""The header readers behind media.sniff: an image's size read from the bytes, with the checks that bound what
libmtmd's image decoder (stb_image) will spend on it, and the bounds and the error audio_headers.py shares.
Stdlib only; nothing here decodes pixels."""

from __future__ import annotations

import struct
import zlib

from localgen.errors import UsageError

MAX_PIXELS = 50_000_000  # width × height, read from the header before any decode (a 50-megapixel photo)
MAX_SIDE = 16_384
MAX_DECODED = MAX_PIXELS * 4  # a PNG's samples, decoded: 50 megapixels of 8-bit RGBA (16-bit ones: half that)
MAX_AUDIO_S = 600.0  # ten minutes
_PNG_END = b"IEND\xaeB`\x82"  # the last chunk's type and CRC (the same in every PNG)


class MediaError(UsageError):
    """An attachment that cannot be used: unreadable, unsupported, too large, corrupt."""


def check_size(fmt: str, source: str, w: int, h: int) -> None:
    """A MediaError for an image whose header gives no size, or one past MAX_SIDE or MAX_PIXELS."""
    if w <= 0 or h <= 0:
        raise MediaError(f"{source} is a corrupt {fmt}: its header gives a size of {w}×{h}")
    if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        raise MediaError(f"{source} is {w}×{h} pixels; an image may have at most {MAX_PIXELS / 1e6:.0f} "
                         f"megapixels and {MAX_SIDE:,} pixels a side", hint="scale it down first")


def check_seconds(seconds: float, source: str, more: bool = False) -> None:
    """A MediaError for audio longer than MAX_AUDIO_S (`more`: counting stopped there, so it is longer)."""
    if seconds > MAX_AUDIO_S:
        size = f"more than {MAX_AUDIO_S / 60:.1f}" if more else f"{seconds / 60:.1f}"
        raise MediaError(f"{source} is {size} minutes of audio; at most {MAX_AUDIO_S / 60:.0f} minutes are taken",
                         hint="cut it into shorter pieces")


# Each reader below bounds what the decoder will spend before it runs: stb_image (PNG, JPEG, GIF, BMP) sizes
# its buffers from the header, and inflates a PNG's IDAT stream to its end whatever the header says;
# miniaudio (WAV, MP3, FLAC) decodes as many samples as the header claims (WAV, FLAC, an MP3's Xing
# header) or, for an MP3 without one, as many frames as the file holds. Loops over a file's structure are
# capped, so no input costs more than a few hundred thousand steps here.
MAX_STEPS = 100_000
_PNG_KINDS = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (1, (1, 2, 4, 8)), 4: (2, (8, 16)), 6: (4, (8, 16))}
_PNG_NAMES = {0: "grey", 2: "RGB", 3: "palette", 4: "grey and alpha", 6: "RGBA"}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
PNG_SLACK = 1 << 20  # past the header's size: stb_image ignores what follows it, as some encoders write more
_INFLATE_IN, _INFLATE_OUT = 1 << 16, 1 << 20  # per zlib call: 64 KiB read, 1 MiB written (then dropped)


def png_size(data: bytes, source: str) -> tuple[int, int]:
    """A PNG's width and height, once its IDAT stream is known to inflate to no more than its header's size
    (stb_image would inflate it all)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise MediaError(f"{source} is a truncated or corrupt PNG")
    w, h, depth, kind, method, filt, interlace = struct.unpack(">IIBBBBB", data[16:29])
    check_size("PNG", source, w, h)
    if kind not in _PNG_KINDS or depth not in _PNG_KINDS[kind][1] or method or filt or interlace > 1:
        raise MediaError(f"{source} is a corrupt PNG: colour type {kind} at {depth} bits (compression {method}, "
                         f"filter {filt}, interlace {interlace}) is not one the PNG standard has")
    bits = _PNG_KINDS[kind][0] * depth
    if w * h * bits // 8 > MAX_DECODED:  # 16 bits a sample: stb_image holds them all, then the 8-bit copy
        raise MediaError(f"{source} is a {w}×{h} PNG of 16-bit {_PNG_NAMES[kind]}: {w * h * bits // 8 / 1e6:.0f} MB "
                         f"of samples decoded, where a picture may take at most {MAX_DECODED / 1e6:.0f} MB (50 "
                         "megapixels of 8-bit RGBA)", hint="scale it down, or save it at 8 bits a sample")
    if interlace:  # Adam7: seven sub-images, each row with its filter byte; an empty pass has no rows
        size = sum(((h - y0 + dy - 1) // dy) * (1 + (((w - x0 + dx - 1) // dx) * bits + 7) // 8)
                   for x0, y0, dx, dy in _ADAM7 if w > x0 and h > y0)
    else:
        size = h * (1 + (w * bits + 7) // 8)
    _png_inflates_within(data, _png_idat(data, source), source, f"{w}×{h}", size)
    return w, h


def _png_idat(data: bytes, source: str) -> list[tuple[int, int]]:
    """Where each IDAT chunk's data lies, up to IEND."""
    spans: list[tuple[int, int]] = []
    i, n = 8, len(data)
    for _ in range(MAX_STEPS):
        if i + 12 > n:
            break
        (length,) = struct.unpack(">I", data[i:i + 4])
        kind, end = data[i + 4:i + 8], i + 8 + length
        if end + 4 > n:
            break
        if kind == b"IDAT":
            spans.append((i + 8, end))
        elif kind == b"IEND":
            return spans
        i = end + 4
    else:
        raise MediaError(f"{source} is a corrupt PNG: more than {MAX_STEPS:,} chunks")
    if _PNG_END not in data:  # libmtmd's decoder (stb_image) reads chunks up to this one
        raise MediaError(f"{source} is a truncated PNG: it ends before its IEND chunk")
    raise MediaError(f"{source} is a corrupt PNG: a chunk runs past the end of the file")


def _png_inflates_within(data: bytes, spans: list[tuple[int, int]], source: str, dims: str, size: int) -> None:
    """Inflate the IDAT stream a piece at a time, counting and dropping the output, to `size` bytes and
    PNG_SLACK more. Other damage is the decoder's to report (it stops there too); a stream zlib refuses after
    its header is refused here, as stb_image's inflater is more lenient (incomplete Huffman codes)."""
    limit = size + PNG_SLACK
    too_much = (f"{source} is a corrupt PNG: its pixel data inflates to more than {limit:,} bytes, where its "
                f"{dims} header needs {size:,}")
    head = b"".join(data[a:min(b, a + 2)] for a, b in spans[:3])[:2]
    if len(head) < 2 or (head[0] * 256 + head[1]) % 31 or head[0] & 0x0F != 8 or head[1] & 0x20:
        return  # stb_image stops at these two bytes
    d = zlib.decompressobj()
    out = 0
    view = memoryview(data)
    try:
        for a, b in spans:
            for at in range(a, b, _INFLATE_IN):
                piece: bytes | memoryview = view[at:min(b, at + _INFLATE_IN)]
                while piece and not d.eof:
                    out += len(d.decompress(piece, _INFLATE_OUT))
                    if out > limit:
                        raise MediaError(too_much)
                    piece = d.unconsumed_tail
        while not d.eof:  # what zlib holds back once the input is all in
            got = len(d.decompress(b"", _INFLATE_OUT))
            out += got
            if out > limit:
                raise MediaError(too_much)
            if not got:
                break
    except zlib.error as e:
        raise MediaError(f"{source} is a corrupt PNG: its pixel data is not valid deflate data "
                         f"({str(e).rsplit(': ', 1)[-1]})") from None


BMP_HEADERS = (12, 16, 40, 52, 56, 64, 108, 124)  # BITMAPCOREHEADER, OS/2 2.x (16, 64), BITMAPINFOHEADER, V2-V5
_BMP_HINT = "save it as a PNG (or a Windows BMP without RLE compression)"


def bmp_size(data: bytes, source: str) -> tuple[int, int]:
    """A BMP's width and height, of a kind stb_image reads, with all the pixel rows its header promises."""
    header = struct.unpack("<I", data[14:18])[0]
    if header in (12, 16, 64):
        raise MediaError(f"{source} is an OS/2 BMP ({header}-byte header), which localgen cannot read",
                         hint=_BMP_HINT)
    if header == 52:
        raise MediaError(f"{source} is a BMP with a {header}-byte header, which localgen cannot read", hint=_BMP_HINT)
    if len(data) < 14 + 40:
        raise MediaError(f"{source} is a truncated or corrupt BMP")
    (offset,) = struct.unpack("<I", data[10:14])
    w, h, planes, bpp, compression = struct.unpack("<iiHHI", data[18:34])
    h = abs(h)  # negative: rows top to bottom
    check_size("BMP", source, w, h)
    if compression in (1, 2):
        raise MediaError(f"{source} is a run-length encoded (RLE) BMP, which localgen cannot read", hint=_BMP_HINT)
    if compression in (4, 5):
        raise MediaError(f"{source} is a BMP holding a {'JPEG' if compression == 4 else 'PNG'}, which localgen "
                         "cannot read", hint=_BMP_HINT)
    if planes != 1 or bpp not in (1, 4, 8, 16, 24, 32) or compression not in (0, 3) or \
            (compression == 3 and bpp not in (16, 32)):
        raise MediaError(f"{source} is a BMP of a kind localgen cannot read ({bpp} bits a pixel, compression "
                         f"{compression}, {planes} planes)", hint=_BMP_HINT)
    need = offset + (w * bpp + 31) // 32 * 4 * (h - 1) + (w * bpp + 7) // 8  # the last row's padding may be cut
    if offset < 14 + header or len(data) < need:
        raise MediaError(f"{source} is a truncated BMP: its {w}×{h} pixels at {bpp} bits need {need:,} bytes "
                         f"and it has {len(data):,}")
    return w, h


_JPEG_KINDS = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical", 0xC7: "hierarchical",
               0xC9: "arithmetic-coded", 0xCA: "arithmetic-coded", 0xCB: "arithmetic-coded",
               0xCD: "hierarchical", 0xCE: "hierarchical", 0xCF: "hierarchical"}  # stb_image: SOF0-2 only


def jpeg_size(data: bytes, source: str) -> tuple[int, int]:
    """Width and height from the first start-of-frame marker, of a kind stb_image decodes, in a file whose
    first scan follows with the tables it needs, and an end-of-image marker after that (a thumbnail's, in the
    EXIF block before the frame, does not count). stb_image decodes a file without a scan, or one whose tables
    are missing, to a grey or garbled picture without a word."""
    i, n = 2, len(data)
    size: tuple[int, int] | None = None
    quant: set[int] = set()
    huffman: set[tuple[int, int]] = set()  # (0: DC or 1: AC, table)
    parts: dict[int, int] = {}  # the frame's components: id -> quantization table
    progressive = False
    for _ in range(MAX_STEPS):
        if i + 4 > n or data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker == 0xD9:  # end of image
            break
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        body = data[i + 4:i + 2 + length]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and size is None:
            if i + 10 > n:
                break
            bits, h, w, count = struct.unpack(">BHHB", data[i + 4:i + 10])
            if marker in _JPEG_KINDS or bits != 8 or count not in (1, 3, 4):
                kind = _JPEG_KINDS.get(marker) or (f"{bits}-bit" if bits != 8 else f"{count}-component")
                raise MediaError(f"{source} is a JPEG of a kind localgen cannot read ({kind})",
                                 hint="save it as a baseline or progressive 8-bit JPEG, or a PNG")
            check_size("JPEG", source, w, h)
            size, progressive = (w, h), marker == 0xC2
            parts = {body[6 + 3 * k]: body[8 + 3 * k] for k in range(count) if 8 + 3 * k < len(body)}
        elif marker == 0xDB:  # quantization tables: each a byte of precision and id, then 64 values of 1 or 2 bytes
            at = 0
            while at < len(body):
                quant.add(body[at] & 0x0F)
                at += 1 + 64 * (2 if body[at] >> 4 else 1)
        elif marker == 0xC4:  # Huffman tables: each a byte of class and id, 16 counts, then that many values
            at = 0
            while at + 17 <= len(body):
                huffman.add((body[at] >> 4, body[at] & 0x0F))
                at += 17 + sum(body[at + 1:at + 17])
        elif marker == 0xDA and size is not None:
            _jpeg_scan_tables(body, parts, quant, huffman, progressive, source)
            if data.rfind(b"\xff\xd9") < i:  # no end-of-image after the scan: stb_image would grey the rest
                raise MediaError(f"{source} is a truncated JPEG: it ends before its end-of-image marker")
            return size
        if length < 2:
            break
        i += 2 + length
    if size is not None:
        raise MediaError(f"{source} is a truncated or corrupt JPEG: no image data (scan) follows its frame header")
    raise MediaError(f"{source} is a truncated or corrupt JPEG (no frame header)")


def _jpeg_scan_tables(body: bytes, parts: dict[int, int], quant: set[int], huffman: set[tuple[int, int]],
                      progressive: bool, source: str) -> None:
    """A MediaError where the first scan names a component the frame lacks, or a table the file has not
    defined before it (a progressive scan's DC-only or refining passes need fewer)."""
    count = body[0] if body else 0
    if not count or len(body) < 1 + 2 * count + 3:
        raise MediaError(f"{source} is a corrupt JPEG: its scan header is cut short")
    ss, se, ah = body[1 + 2 * count], body[2 + 2 * count], body[3 + 2 * count] >> 4
    for k in range(count):
        cid, tables = body[1 + 2 * k], body[2 + 2 * k]
        if cid not in parts:
            raise MediaError(f"{source} is a corrupt JPEG: its scan names component {cid}, which its frame lacks")
        need = [f"quantization table {parts[cid]}"] if parts[cid] not in quant else []
        if (not progressive or (ss == 0 and ah == 0)) and (0, tables >> 4) not in huffman:
            need.append(f"DC Huffman table {tables >> 4}")
        if (not progressive or se > 0) and (1, tables & 0x0F) not in huffman:
            need.append(f"AC Huffman table {tables & 0x0F}")
        if need:
            raise MediaError(f"{source} is a corrupt JPEG: its scan uses {' and '.join(need)}, which it does not "
                             "define")


def gif_size(data: bytes, source: str) -> tuple[int, int]:
    """A GIF's logical screen: stb_image decodes the first frame, inside it; a file that ends before that
    frame's data does is truncated (stb_image would show the part that arrived)."""
    if len(data) < 13:
        raise MediaError(f"{source} is a truncated or corrupt GIF")
    w, h = struct.unpack("<HH", data[6:10])
    check_size("GIF", source, w, h)  # first: a walk to prove a picture too large is truncated is of no use
    if _gif_cut_short(data):
        raise MediaError(f"{source} is a truncated GIF: it ends inside its first picture")
    return int(w), int(h)


def _gif_cut_short(data: bytes) -> bool:
    """Whether the blocks up to the end of the first image's data run past the file (a colour table, an
    extension's or the image's sub-blocks). Anything else odd is left to stb_image, as is a walk that would
    take more than MAX_STEPS sub-blocks."""
    pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    steps = 0
    while pos < len(data) and steps < MAX_STEPS:
        kind = data[pos]
        if kind == 0x2C:  # an image: its descriptor, a local colour table, the LZW code size, then its data
            if pos + 10 > len(data):
                return True
            flags = data[pos + 9]
            pos += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1
        elif kind == 0x21:  # an extension: its label, then sub-blocks
            pos += 2
        else:  # the trailer before any image, or not a block: stb_image's to judge
            return False
        while pos < len(data) and steps < MAX_STEPS:  # sub-blocks: a length byte, then that many bytes; 0 ends
            n = data[pos]
            pos += 1 + n
            steps += 1
            if n == 0:
                break
        else:
            return steps < MAX_STEPS
        if kind == 0x2C:
            return pos > len(data)
    return pos >= len(data) and steps < MAX_STEPS


def webp_size(data: bytes) -> str:
    """` (W×H pixels)` from a WebP's VP8, VP8L or VP8X chunk, or nothing."""
    kind = data[12:16]
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = (v & 0x3FFF for v in struct.unpack("<HH", data[26:30]))
    elif kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        w, h = (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1
    elif kind == b"VP8X" and len(data) >= 30:
        w, h = int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    else:
        return ""
    return f" ({w}×{h} pixels)"
