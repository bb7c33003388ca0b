"""Images and audio given with a prompt: read (a file, a URL, stdin, a data: URI, base64), recognised by
their bytes, bounded before anything decodes them, and carried in messages as OpenAI content parts
(`image_url` with a data: URI, `input_audio` with base64), so a chat file, `run` and `serve` hold them the
same way. Stdlib only: libmtmd decodes them later (engine/mtmd.py)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localgen.errors import UsageError

if TYPE_CHECKING:
    from localgen.fetch import Fetcher

Kind = Literal["image", "audio"]

MARKER = "<__media__>"  # libmtmd's default media marker: where each image or clip goes in the rendered prompt
MAX_BYTES = 64 * 2**20  # one attachment, encoded
MAX_PIXELS = 50_000_000  # width × height, read from the header before any decode (a 50-megapixel photo)
MAX_SIDE = 16_384
MAX_AUDIO_S = 600.0  # ten minutes

# what libmtmd decodes (stb_image; miniaudio), by the format's name
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp",
         "WAV": "audio/wav", "MP3": "audio/mpeg", "FLAC": "audio/flac"}
_KNOWN_OTHER = ((b"RIFF", 8, b"WEBP", "WebP"), (b"II*\x00", 0, b"", "TIFF"), (b"MM\x00*", 0, b"", "TIFF"),
                (b"%PDF", 0, b"", "PDF"), (b"OggS", 0, b"", "Ogg"), (b"\x1aE\xdf\xa3", 0, b"", "WebM/Matroska"))
_PNG_END = b"IEND\xaeB`\x82"  # the last chunk's type and CRC (the same in every PNG)
_DATA_URI = re.compile(r"data:([\w.+/-]*)((?:;[\w.+-]+=[\w.+-]+)*)(;base64)?,", re.I)


class MediaError(UsageError):
    """An attachment that cannot be used: unreadable, unsupported, too large, corrupt."""


# A message carries an attachment as a data: URI or base64, so whatever reads it back (libmtmd's decode, the
# audio length) would name it "data URI": the source each part was made from is kept here, by the SHA-256 of
# its bytes, so that an error names the file or URL the user gave. The oldest go first past the bound.
_SOURCES: dict[str, str] = {}
_SOURCES_LOCK = threading.Lock()
MAX_SOURCES = 256


def _remember(m: Media) -> None:
    if m.source in ("data URI", "base64 data"):
        return
    with _SOURCES_LOCK:
        _SOURCES.pop(m.sha256, None)
        _SOURCES[m.sha256] = m.source
        while len(_SOURCES) > MAX_SOURCES:
            del _SOURCES[next(iter(_SOURCES))]


def _sniff_part(data: bytes, default: str) -> Media:
    """sniff() for bytes read back from a content part, named by the source the part was made from."""
    if not _SOURCES:  # nothing made a part here (serve without image URLs): no hash to take
        return sniff(data, default)
    digest = hashlib.sha256(data).hexdigest()
    with _SOURCES_LOCK:
        source = _SOURCES.get(digest, default)
    m = sniff(data, source)
    m.__dict__["sha256"] = digest  # the cached_property's value: libmtmd's id needs it, taken once
    return m


@dataclass(frozen=True)
class Media:
    """One image or audio clip: its bytes, what they are, and where they came from (for messages)."""

    kind: Kind
    format: str  # "PNG", "JPEG", ..., "WAV", "MP3", "FLAC"
    data: bytes
    source: str  # a path, a URL, "stdin", "data URI"
    width: int = 0
    height: int = 0
    seconds: float | None = None  # audio, when the header tells

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def mime(self) -> str:
        return _MIME[self.format]

    def label(self) -> str:
        """`photo.png (image, 640×480)`, for notices."""
        name = Path(self.source).name if self.source not in ("stdin", "data URI") else self.source
        size = f", {self.width}×{self.height}" if self.kind == "image" and self.width else ""
        dur = f", {self.seconds:.1f} s" if self.seconds is not None else ""
        return f"{name} ({self.kind}{size}{dur})"

    def part(self) -> dict[str, Any]:
        """The OpenAI content part that carries it (its source remembered, for errors about the part)."""
        _remember(self)
        b64 = base64.b64encode(self.data).decode("ascii")
        if self.kind == "image":
            return {"type": "image_url", "image_url": {"url": f"data:{self.mime};base64,{b64}"}}
        return {"type": "input_audio", "input_audio": {"data": b64, "format": self.format.lower()}}


def sniff(data: bytes, source: str) -> Media:
    """What the bytes are, with the header's size checked against the bounds; a MediaError when they are
    empty, of a format libmtmd cannot read, truncated, or too large."""
    if not data:
        raise MediaError(f"{source} is empty")
    if len(data) > MAX_BYTES:
        raise MediaError(f"{source} is {len(data) / 2**20:.0f} MiB; an attachment may be at most "
                         f"{MAX_BYTES // 2**20} MiB")
    head = data[:64]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png(data, source)
    if head.startswith(b"\xff\xd8\xff"):
        w, h = _jpeg_size(data, source)
        return _image("JPEG", data, source, w, h)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 13:
            raise MediaError(f"{source} is a truncated or corrupt GIF")
        w, h = struct.unpack("<HH", data[6:10])  # stb_image decodes the first frame, inside this screen
        return _image("GIF", data, source, w, h)
    if head.startswith(b"BM") and len(data) >= 18 and struct.unpack("<I", data[14:18])[0] in _BMP_HEADERS:
        return _bmp(data, source)
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return _audio("WAV", data, source, _wav_seconds(data, source))
    if head.startswith(b"fLaC"):
        return _audio("FLAC", data, source, _flac_seconds(data, source))
    if head.startswith(b"ID3") or _MP3_FRAME.match(head):
        return _audio("MP3", data, source, _mp3_seconds(data, source))
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        raise MediaError(f"{source} is WebP{_webp_size(data)}, which localgen cannot read",
                         hint=f"images: {', '.join(IMAGE_FORMATS)}; audio: {', '.join(AUDIO_FORMATS)}")
    for magic, at, tag, name in _KNOWN_OTHER:
        if head.startswith(magic) and (not tag or head[at:at + len(tag)] == tag):
            raise MediaError(f"{source} is {name}, which localgen cannot read",
                             hint=f"images: {', '.join(IMAGE_FORMATS)}; audio: {', '.join(AUDIO_FORMATS)}")
    raise MediaError(f"{source} is not an image or audio file localgen can read",
                     hint=f"images: {', '.join(IMAGE_FORMATS)}; audio: {', '.join(AUDIO_FORMATS)}")


def _image(fmt: str, data: bytes, source: str, w: int, h: int) -> Media:
    if w <= 0 or h <= 0:
        raise MediaError(f"{source} is a corrupt {fmt}: its header gives a size of {w}×{h}")
    if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        raise MediaError(f"{source} is {w}×{h} pixels; an image may have at most {MAX_PIXELS / 1e6:.0f} "
                         f"megapixels and {MAX_SIDE:,} pixels a side", hint="scale it down first")
    return Media("image", fmt, data, source, w, h)


def _audio(fmt: str, data: bytes, source: str, seconds: float | None) -> Media:
    if seconds is not None:
        check_seconds(seconds, source)
    return Media("audio", fmt, data, source, seconds=seconds)


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
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
PNG_SLACK = 1 << 20  # past the header's size: stb_image ignores what follows it, as some encoders write more
_INFLATE_IN, _INFLATE_OUT = 1 << 16, 1 << 20  # per zlib call: 64 KiB read, 1 MiB written (then dropped)


def _png(data: bytes, source: str) -> Media:
    """A PNG whose IDAT stream inflates to no more than its header's size (stb_image would inflate it all)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise MediaError(f"{source} is a truncated or corrupt PNG")
    w, h, depth, kind, method, filt, interlace = struct.unpack(">IIBBBBB", data[16:29])
    image = _image("PNG", data, source, w, h)
    if kind not in _PNG_KINDS or depth not in _PNG_KINDS[kind][1] or method or filt or interlace > 1:
        raise MediaError(f"{source} is a corrupt PNG: colour type {kind} at {depth} bits (compression {method}, "
                         f"filter {filt}, interlace {interlace}) is not one the PNG standard has")
    bits = _PNG_KINDS[kind][0] * depth
    if interlace:  # Adam7: seven sub-images, each row with its filter byte; an empty pass has no rows
        size = sum(((h - y0 + dy - 1) // dy) * (1 + (((w - x0 + dx - 1) // dx) * bits + 7) // 8)
                   for x0, y0, dx, dy in _ADAM7 if w > x0 and h > y0)
    else:
        size = h * (1 + (w * bits + 7) // 8)
    _png_inflates_within(data, _png_idat(data, source), source, f"{w}×{h}", size)
    return image


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


_BMP_HEADERS = (12, 16, 40, 52, 56, 64, 108, 124)  # BITMAPCOREHEADER, OS/2 2.x (16, 64), BITMAPINFOHEADER, V2-V5
_BMP_HINT = "save it as a PNG (or a Windows BMP without RLE compression)"


def _bmp(data: bytes, source: str) -> Media:
    """A BMP of a kind stb_image reads, with all the pixel rows its header promises."""
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
    image = _image("BMP", data, source, w, h)
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
    return image


_JPEG_KINDS = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical", 0xC7: "hierarchical",
               0xC9: "arithmetic-coded", 0xCA: "arithmetic-coded", 0xCB: "arithmetic-coded",
               0xCD: "hierarchical", 0xCE: "hierarchical", 0xCF: "hierarchical"}  # stb_image: SOF0-2 only


def _jpeg_size(data: bytes, source: str) -> tuple[int, int]:
    """Width and height from the first start-of-frame marker, of a kind stb_image decodes."""
    i, n = 2, len(data)
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
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 10 > n:
                break
            bits, h, w, parts = struct.unpack(">BHHB", data[i + 4:i + 10])
            if marker in _JPEG_KINDS or bits != 8 or parts not in (1, 3, 4):
                kind = _JPEG_KINDS.get(marker) or (f"{bits}-bit" if bits != 8 else f"{parts}-component")
                raise MediaError(f"{source} is a JPEG of a kind localgen cannot read ({kind})",
                                 hint="save it as a baseline or progressive 8-bit JPEG, or a PNG")
            return w, h
        if length < 2:
            break
        i += 2 + length
    raise MediaError(f"{source} is a truncated or corrupt JPEG (no frame header)")


def _webp_size(data: bytes) -> str:
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


# WAV codecs miniaudio decodes, and the samples a block of each holds (ADPCM: a few header bytes, then 4 bits
# a sample); PCM's frame size is its channels × bits, whatever the header's block alignment says.
_WAV_CODECS = {1: "PCM", 3: "float", 6: "A-law", 7: "µ-law", 2: "MS ADPCM", 0x11: "IMA ADPCM"}


def _wav_seconds(data: bytes, source: str) -> float:
    """The length of a WAV file from its fmt and data chunks (the data that is there, as miniaudio reads)."""
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
            size = min(size, len(data) - i - 8) if size != 0xFFFFFFFF else len(data) - i - 8
            if codec in (2, 0x11):
                head = (7 if codec == 2 else 4) * channels
                per_block = max(1, (block - head) * 2 // channels + (2 if codec == 2 else 1))
                return size / block * per_block / rate
            frame = channels * bits // 8 if bits and bits % 8 == 0 else block
            return size / max(1, min(frame, block)) / rate
        i += 8 + size + (size & 1)
    raise MediaError(f"{source} is a truncated or corrupt WAV (no fmt or data chunk)")


def _flac_seconds(data: bytes, source: str) -> float:
    """The length from FLAC's STREAMINFO block, which miniaudio decodes that many samples of."""
    if len(data) < 8 + 34 or data[4] & 0x7F != 0:
        raise MediaError(f"{source} is a truncated or corrupt FLAC (no STREAMINFO block)")
    info = int.from_bytes(data[18:26], "big")  # after 10 bytes of block and frame sizes
    rate = info >> 44
    total = info & ((1 << 36) - 1)
    if not rate:
        raise MediaError(f"{source} is a corrupt FLAC: its STREAMINFO gives a sample rate of 0")
    if not total:
        raise MediaError(f"{source} is a FLAC that does not give its length (its STREAMINFO says 0 samples), "
                         "which localgen cannot read", hint="re-encode it, e.g. `ffmpeg -i IN -c:a flac OUT.flac`")
    return total / rate


# MPEG audio: a frame header's second byte (sync, version not 01, layer not 00) and third (bitrate not 1111,
# sample rate not 11) as byte sets, so a regular expression finds the next frame at C's speed.
def _byteset(ok: Any) -> bytes:
    return b"[" + b"".join(re.escape(bytes([b])) for b in range(256) if ok(b)) + b"]"


_MP3_FRAME = re.compile(b"\xff" + _byteset(lambda b: b >> 5 == 7 and b >> 3 & 3 != 1 and b >> 1 & 3 != 0)
                        + _byteset(lambda b: b >> 4 != 15 and b >> 2 & 3 != 3), re.S)
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {(True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
             (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
             (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
             (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}


def _mp3_seconds(data: bytes, source: str) -> float | None:
    """An MP3's length: what its Xing/Info (or VBRI) header claims, and its frames counted from their headers
    with no decoding (miniaudio decodes them all when there is no Xing header); the count stops past
    MAX_AUDIO_S. None when no frame is found (the decoder then says what is wrong)."""
    i = 0
    if data.startswith(b"ID3") and len(data) >= 10:  # ID3v2: a syncsafe size, maybe a footer
        i = 10 + sum((b & 0x7F) << (7 * (3 - k)) for k, b in enumerate(data[6:10])) + (10 if data[5] & 0x10 else 0)
    counted, claimed = 0.0, None
    while counted <= MAX_AUDIO_S:  # a frame is at least 8 ms: at most 75,000 steps
        m = _MP3_FRAME.search(data, i)
        if m is None:
            break
        at = m.start()
        b1, b2 = data[at + 1], data[at + 2]
        version, layer = b1 >> 3 & 3, 4 - (b1 >> 1 & 3)
        mpeg1 = version == 3
        rate = _MP3_RATES[version][b2 >> 2 & 3]
        samples = 384 if layer == 1 else 1152 if layer == 2 or mpeg1 else 576
        kbps = _MP3_KBPS[(mpeg1, layer if mpeg1 else min(layer, 2))][b2 >> 4]
        if not counted:
            claimed = _mp3_claimed(data, at, mpeg1, samples / rate)
        counted += samples / rate
        if not kbps:  # free format: the next frame is found by its header
            i = at + 3
        elif layer == 1:
            i = at + (12_000 * kbps // rate + (b2 >> 1 & 1)) * 4
        else:
            i = at + samples // 8 * 1000 * kbps // rate + (b2 >> 1 & 1)
    check_seconds(counted, source, more=True)
    return claimed if claimed is not None else counted or None


def _mp3_claimed(data: bytes, at: int, mpeg1: bool, frame_s: float) -> float | None:
    """The length a first frame's Xing/Info or VBRI header gives, if any."""
    mono = at + 3 < len(data) and data[at + 3] >> 6 == 3
    x = at + 4 + ((17 if mono else 32) if mpeg1 else (9 if mono else 17))  # after the side information
    frames = 0
    if data[x:x + 4] in (b"Xing", b"Info") and len(data) >= x + 12:
        flags, n = struct.unpack(">II", data[x + 4:x + 12])
        frames = n if flags & 1 else 0
    elif data[at + 36:at + 40] == b"VBRI" and len(data) >= at + 54:
        (frames,) = struct.unpack(">I", data[at + 50:at + 54])
    return frames * frame_s if frames else None


def read(spec: str, stdin: Any = None) -> Media:
    """An attachment named on the command line: a file path, an http(s) URL, a data: URI, or `-` (stdin's
    bytes)."""
    if spec == "-":
        if stdin is None:
            import sys

            stdin = sys.stdin.buffer
        data = stdin.read(MAX_BYTES + 1)
        return sniff(data, "stdin")
    if spec.startswith("data:"):
        return from_url(spec, allow_http=False)
    if re.match(r"https?://", spec, re.I):
        return fetch(spec)
    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            raise MediaError(f"{spec} is a folder, not a file")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise MediaError(f"{spec} is {size / 2**20:.0f} MiB; an attachment may be at most "
                             f"{MAX_BYTES // 2**20} MiB")
        data = path.read_bytes()
    except FileNotFoundError:
        raise MediaError(f"no such file: {spec}") from None
    except PermissionError:
        raise MediaError(f"cannot read {spec}: permission denied") from None
    except OSError as e:
        raise MediaError(f"cannot read {spec}: {e.strerror or e}") from None
    return sniff(data, spec)


def fetch(url: str, fetcher: Fetcher | None = None, cancel: threading.Event | None = None) -> Media:
    """The media at an http(s) URL, fetched by localgen/fetch.py (by default as the CLI fetches: private
    addresses allowed, a user's own LAN being theirs to reach; a server passes a Fetcher that refuses them)."""
    from localgen.fetch import Fetcher, FetchError

    try:
        data = (fetcher or Fetcher(private=True, timeout=30.0, max_bytes=MAX_BYTES, proxies=True)).get(url, cancel)
    except FetchError as e:
        raise MediaError(f"cannot fetch {url}: {e.message}") from None
    return sniff(data, url)


def from_url(url: str, allow_http: bool) -> Media:
    """An image_url's or input_audio's `url`/`data`: a data: URI, plain base64, or (with allow_http) an
    http(s) URL."""
    if not isinstance(url, str) or not url:
        raise MediaError("the media part has no data")
    m = _DATA_URI.match(url)
    if m:
        body = url[m.end():]
        if not m.group(3):
            from urllib.parse import unquote_to_bytes

            return _sniff_part(unquote_to_bytes(body), "data URI")
        return _sniff_part(_b64(body), "data URI")
    if re.match(r"https?://", url, re.I):
        if not allow_http:
            raise MediaError("image URLs are not fetched by this server (start it with --allow-image-urls); "
                             "send the image as a data: URI")
        from localgen.fetch import Fetcher

        return fetch(url, Fetcher(private=False, max_bytes=MAX_BYTES))  # a request's URL: nothing inside
    if re.match(r"[a-z][a-z0-9+.-]*:", url, re.I) and not re.match(r"[A-Za-z0-9+/]{8}", url):
        raise MediaError(f"unsupported media URL scheme: {url.split(':', 1)[0]}:")
    return _sniff_part(_b64(url), "base64 data")


def _b64(text: str) -> bytes:
    if len(text) > MAX_BYTES * 4 // 3 + 16:
        raise MediaError(f"the media data is larger than {MAX_BYTES // 2**20} MiB")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the media data is not valid base64") from None


def part_media(part: Any, allow_http: bool = False) -> Media | None:
    """The Media in one OpenAI content part (None for a text part); a MediaError for a malformed one."""
    if not isinstance(part, dict):
        raise MediaError("each content part must be an object")
    kind = part.get("type")
    if kind == "text":
        return None
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        media = from_url(str(url or ""), allow_http)
        if media.kind != "image":
            raise MediaError(f"an image_url part holds {media.format} audio")
        return media
    if kind == "input_audio":
        inner = part.get("input_audio")
        data = inner.get("data") if isinstance(inner, dict) else None
        media = from_url(str(data or ""), allow_http=False)
        if media.kind != "audio":
            raise MediaError(f"an input_audio part holds a {media.format} image")
        return media
    raise MediaError(f"unsupported content part type: {kind!r}")


def has_media(messages: Any) -> bool:
    """Whether any message's content holds a media part."""
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") != "text"
                                                          for p in m["content"]) for m in messages)


def split(messages: Any, marker: str) -> tuple[list[dict[str, Any]], list[Media]]:
    """Messages with string content, each media part replaced by `marker` (llama.cpp's way: text parts
    joined with newlines, none next to a marker), and the media in order."""
    out: list[dict[str, Any]] = []
    found: list[Media] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text, last_marker = "", False
            for p in content:
                media = part_media(p, allow_http=False)
                if media is None:
                    if text and not last_marker:
                        text += "\n"
                    text += str(p.get("text", ""))
                    last_marker = False
                else:
                    found.append(media)
                    text += marker
                    last_marker = True
            m = {**m, "content": text}
        out.append(m)
    return out, found


def content(text: str, media: list[Media]) -> str | list[dict[str, Any]]:
    """A user message's content: the text alone, or the media first and then the text (as llama-mtmd-cli
    puts the marker before the prompt)."""
    if not media:
        return text
    return [*(m.part() for m in media), {"type": "text", "text": text}]


def text_of(content: Any) -> str:
    """A message's text, its media shown as `[image]` / `[audio]` (for listings, logs and plain turns)."""
    if isinstance(content, list):
        bits = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                bits.append(str(p.get("text", "")))
            elif isinstance(p, dict):
                bits.append("[audio]" if p.get("type") == "input_audio" else "[image]")
        return " ".join(b for b in bits if b)
    return content if isinstance(content, str) else ""


DROPPED = re.compile(r"""^\s*(['"]?)(?P<path>(?:~|/|\.{1,2}/|[A-Za-z]:\\)[^\n]*?"""
                     r"""\.(?:png|jpe?g|gif|bmp|wav|mp3|flac))\1\s*$""", re.I)


def dropped_path(line: str) -> Path | None:
    """The file a line names when it is nothing but the path of an image or audio file that exists (what
    a terminal types when a file is dropped on it: maybe quoted, spaces maybe escaped)."""
    m = DROPPED.match(line)
    if not m:
        return None
    raw = m.group("path")
    path = Path(raw.replace("\\ ", " ") if not m.group(1) else raw).expanduser()
    return path if path.is_file() else None
