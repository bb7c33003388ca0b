"""The header readers behind media.sniff: an image's size and an audio clip's length read from the bytes,
with the checks that bound what libmtmd's decoders (stb_image, miniaudio) will spend on them. Stdlib only;
nothing here decodes pixels or samples."""

from __future__ import annotations

import re
import struct
import zlib
from typing import Any

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


# WAV codecs miniaudio decodes. Its WAV reader (dr_wav) gives the clip's length, which libmtmd's helper sizes
# its buffer by, from the data chunk's size alone: PCM's frame is its channels × bits (its block alignment when
# the bits are not whole bytes); ADPCM's blocks each count 2 samples a byte past a header of 6 (MS) or 4 (IMA)
# bytes a channel, in unsigned 64-bit arithmetic, so a data chunk shorter than its blocks' headers wraps around
# to some 1.8e19 frames. What dr_wav refuses is refused here too: libmtmd's decoder would then try the bytes
# as FLAC and as MP3, whose lengths this reader has not bounded.
_WAV_CODECS = {1: "PCM", 3: "float", 6: "A-law", 7: "µ-law", 2: "MS ADPCM", 0x11: "IMA ADPCM"}
_WAV_MAX_RATE, _WAV_MAX_CHANNELS, _WAV_MAX_BITS = 384_000, 256, 64  # dr_wav's MA_DR_WAV_MAX_*
_ADPCM_HEADER = {2: 7, 0x11: 4}  # a block's header, per channel, as the decoder reads it


def wav_seconds(data: bytes, source: str) -> float:
    """The length of a WAV file as miniaudio's dr_wav computes it from the fmt and data chunks; a data chunk
    shorter than its header says is a truncated file (one of unknown length, 0xFFFFFFFF, as a stream writes
    it, runs to the end)."""
    i, codec, channels, rate, block, bits = 12, 0, 0, 0, 0, 0
    for _ in range(MAX_STEPS):
        if i + 8 > len(data):
            break
        cid, size = data[i:i + 4], struct.unpack("<I", data[i + 4:i + 8])[0]
        if cid == b"fmt " and i + 24 <= len(data):
            codec, channels, rate, _, block, bits = struct.unpack("<HHIIHH", data[i + 8:i + 24])
            if codec == 0xFFFE and size >= 40 and i + 34 <= len(data):  # WAVE_FORMAT_EXTENSIBLE: the subformat
                (codec,) = struct.unpack("<H", data[i + 32:i + 34])
        elif cid == b"data":
            if not rate or not block or not channels:
                break
            if codec not in _WAV_CODECS:
                raise MediaError(f"{source} is a WAV in a codec localgen cannot read (format 0x{codec:04X})",
                                 hint="convert it to PCM WAV, MP3 or FLAC")
            there = len(data) - i - 8
            if size != 0xFFFFFFFF and size > there:  # cut short (a download that stopped): not half the clip
                raise MediaError(f"{source} is a truncated WAV: its data chunk promises {size:,} bytes and "
                                 f"{there:,} are there")
            size = size if size != 0xFFFFFFFF else there  # a streamed WAV's unknown length: to the end
            seconds = _wav_frames(codec, channels, rate, block, bits, size, source) / rate
            _mp3_tags_within(data, source)
            return seconds
        i += 8 + size + (size & 1)
    raise MediaError(f"{source} is a truncated or corrupt WAV (no fmt or data chunk)")


def _wav_frames(codec: int, channels: int, rate: int, block: int, bits: int, size: int, source: str) -> int:
    """dr_wav's frame count for `size` bytes of data; a MediaError where dr_wav refuses the header or its
    count would wrap around."""
    corrupt = f"{source} is a corrupt {_WAV_CODECS[codec]} WAV"
    if rate > _WAV_MAX_RATE or channels > _WAV_MAX_CHANNELS or not 0 < bits <= _WAV_MAX_BITS:
        raise MediaError(f"{corrupt}: {channels} channel{'s' if channels != 1 else ''} of {bits} bits at {rate:,} "
                         "Hz, which miniaudio does not read")
    if codec in _ADPCM_HEADER:
        head = _ADPCM_HEADER[codec] * channels
        if block <= head or channels > 2:
            raise MediaError(f"{corrupt}: its blocks are {block} bytes, where their headers take {head}"
                             if block <= head else f"{corrupt}: {channels} channels, where ADPCM has 1 or 2")
        blocks = -(-size // block)
        counted = blocks * (6 if codec == 2 else 4) * channels  # dr_wav's count of header bytes
        if counted > size:
            raise MediaError(f"{corrupt}: its data ({size:,} bytes) is shorter than its blocks' headers")
        return (size - counted) * 2 // channels + (blocks if codec == 0x11 else 0)
    frame = channels * bits // 8 if bits % 8 == 0 else block
    if codec in (6, 7) and frame != channels:
        raise MediaError(f"{corrupt}: {bits} bits a sample, where it has 8")
    return size // frame


def flac_seconds(data: bytes, source: str) -> float:
    """The length from FLAC's STREAMINFO block, which miniaudio decodes that many samples of."""
    if len(data) < 8 + 34 or data[4] & 0x7F != 0 or data[5:8] != b"\x00\x00\x22":  # dr_flac: 34 bytes, no other
        raise MediaError(f"{source} is a truncated or corrupt FLAC (no STREAMINFO block)")
    info = int.from_bytes(data[18:26], "big")  # after 10 bytes of block and frame sizes
    rate = info >> 44
    total = info & ((1 << 36) - 1)
    if not rate:
        raise MediaError(f"{source} is a corrupt FLAC: its STREAMINFO gives a sample rate of 0")
    if not total:
        raise MediaError(f"{source} is a FLAC that does not give its length (its STREAMINFO says 0 samples), "
                         "which localgen cannot read", hint="re-encode it, e.g. `ffmpeg -i IN -c:a flac OUT.flac`")
    _mp3_tags_within(data, source)
    return total / rate


def _mp3_tags_within(data: bytes, source: str) -> None:
    """A MediaError for a WAV or FLAC file holding an MP3 frame whose Xing tag claims more than MAX_AUDIO_S:
    libmtmd's decoder tries bytes its WAV or FLAC reader refuses as MP3, and believes the tag."""
    claimed = _mp3_claimed(data)
    if claimed is not None:
        check_seconds(claimed, source)


# MPEG audio: a frame header's second byte (sync, version not 01, layer not 00) and third (bitrate not 1111,
# sample rate not 11) as byte sets, so a regular expression finds the next frame at C's speed.
def _byteset(ok: Any) -> bytes:
    return b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if ok(b)) + b"]"


MP3_FRAME = re.compile(b"\xff" + _byteset(lambda b: b >> 5 == 7 and b >> 3 & 3 != 1 and b >> 1 & 3 != 0)
                        + _byteset(lambda b: b >> 4 != 15 and b >> 2 & 3 != 3), re.S)
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {(True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
             (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
             (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
             (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}


def mp3_seconds(data: bytes, source: str) -> float | None:
    """An MP3's length: what a Xing/Info (or VBRI) header claims, and its frames counted from their headers
    with no decoding (miniaudio decodes them all when there is no Xing header); the count stops past
    MAX_AUDIO_S. None when no frame is found (the decoder then says what is wrong). A FLAC stream behind ID3
    tags is one (miniaudio's FLAC reader skips them), and is bounded as one."""
    i = _id3_end(data, 0)  # dr_mp3 skips one ID3 tag; dr_flac, tried before it, all of them
    flac = _id3_end(data, i, tags=MAX_STEPS)
    if data[flac:flac + 4] == b"fLaC":
        seconds = flac_seconds(data[flac:flac + 64], source)
        _mp3_tags_within(data, source)
        return seconds
    if data[flac:flac + 4] == b"OggS":
        raise MediaError(f"{source} is Ogg behind an ID3 tag, which localgen cannot read",
                         hint="convert it to WAV, MP3 or FLAC")
    counted = 0.0
    while counted <= MAX_AUDIO_S:  # a frame is at least 8 milliseconds: at most 75,000 steps
        m = MP3_FRAME.search(data, i)
        if m is None:
            break
        at = m.start()
        b2 = data[at + 2]
        samples, rate, layer, mpeg1 = _mp3_frame(data, at)
        counted += samples / rate
        kbps = _MP3_KBPS[(mpeg1, layer if mpeg1 else min(layer, 2))][b2 >> 4]
        if not kbps:  # free format: the next frame is found by its header
            i = at + 3
        elif layer == 1:
            i = at + (12_000 * kbps // rate + (b2 >> 1 & 1)) * 4
        else:
            i = at + samples // 8 * 1000 * kbps // rate + (b2 >> 1 & 1)
    check_seconds(counted, source, more=True)
    claimed = _mp3_claimed(data)
    return claimed if claimed is not None else counted or None


def _id3_end(data: bytes, i: int, tags: int = 1) -> int:
    """Where the audio starts after up to `tags` ID3v2 tags from `i` (a syncsafe size, maybe a footer)."""
    for _ in range(tags):
        if data[i:i + 3] != b"ID3" or len(data) < i + 10:
            break
        i += 10 + sum((b & 0x7F) << (7 * (3 - k)) for k, b in enumerate(data[i + 6:i + 10])) + \
            (10 if data[i + 5] & 0x10 else 0)
    return i


def _mp3_frame(data: bytes, at: int) -> tuple[int, int, int, bool]:
    """The samples, sample rate, layer and MPEG-1-ness of the frame header at `at` (one MP3_FRAME matches)."""
    b1, b2 = data[at + 1], data[at + 2]
    version, layer = b1 >> 3 & 3, 4 - (b1 >> 1 & 3)
    mpeg1 = version == 3
    samples = 384 if layer == 1 else 1152 if layer == 2 or mpeg1 else 576
    return samples, _MP3_RATES[version][b2 >> 2 & 3], layer, mpeg1


def _mp3_claimed(data: bytes) -> float | None:
    """The longest length a Xing/Info or VBRI header claims, if any. miniaudio's MP3 reader (dr_mp3) reads a
    Xing/Info tag in the first frame it decodes, after the header, its CRC (2 bytes, when the header's
    protection bit is 0) and the side information, and decodes frames × that frame's samples. Which frame it
    decodes first is its own judgement (it wants a run of frames that agree): every tag that sits where its
    frame's header puts it counts, whichever frame it is in."""
    longest: float | None = None
    for tag in (b"Xing", b"Info", b"VBRI"):
        x = data.find(tag)
        for _ in range(MAX_STEPS):
            if x < 0:
                break
            for at in _mp3_tag_frames(data, x, tag):
                samples, rate, _, _ = _mp3_frame(data, at)
                if tag == b"VBRI":
                    frames = struct.unpack(">I", data[x + 14:x + 18])[0] if len(data) >= x + 18 else 0
                else:
                    flags, n = struct.unpack(">II", data[x + 4:x + 12]) if len(data) >= x + 12 else (0, 0)
                    frames = n if flags & 1 else 0
                if frames:
                    longest = max(longest or 0.0, frames * samples / rate)
            x = data.find(tag, x + 1)
    return longest


def _mp3_tag_frames(data: bytes, x: int, tag: bytes) -> list[int]:
    """The frame headers a Xing/Info tag at `x` (or a VBRI tag, 32 bytes after its header) belongs to."""
    found = []
    offsets = (32,) if tag == b"VBRI" else (13, 15, 21, 23, 36, 38)  # 4 + CRC (0 or 2) + side information
    for k in offsets:
        at = x - 4 - k if tag == b"VBRI" else x - k
        if at < 0 or not MP3_FRAME.match(data, at):
            continue
        mono, mpeg1, crc = data[at + 3] >> 6 == 3, data[at + 1] >> 3 & 3 == 3, not data[at + 1] & 1
        side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
        if tag == b"VBRI" or k == 4 + (2 if crc else 0) + side:
            found.append(at)
    return found
