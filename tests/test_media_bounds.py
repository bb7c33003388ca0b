"""#42: every attachment bounded before it costs. Each picture's size and each sound's length come from its
header and are checked before anything decodes it; then what the decoder would spend is capped, so a file
whose data does not match its header (a PNG whose IDAT inflates far past its IHDR, an MP3 with more frames
than its header says, a BMP with no pixel rows) is refused first. The bombs are built here; sniff() is the
one door (run's --image/-a through read(), serve and chat files through part_media()), so most tests call
it in process; two drive the real CLI."""

from __future__ import annotations

import base64
import os
import re
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, wav, write_audio_mmproj, write_mmproj

MiB = 2**20


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png(w: int, h: int, idat: bytes | list[bytes], depth: int = 8, kind: int = 2, interlace: int = 0,
         palette: bool = False) -> bytes:
    chunks = [idat] if isinstance(idat, bytes) else idat
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, kind, 0, 0, interlace))
            + (_chunk(b"PLTE", b"\0\0\0" * 4) if palette else b"")
            + b"".join(_chunk(b"IDAT", c) for c in chunks) + _chunk(b"IEND", b""))


def _zeros_deflated(n_mib: int) -> bytes:
    """A zlib stream of `n_mib` MiB of zeros, made in milliseconds: one fully flushed MiB repeated."""
    c = zlib.compressobj(9)
    one = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    n = n_mib * MiB
    return one[:2] + one[2:] * n_mib + b"\x03\x00" + struct.pack(">I", (n % 65521) << 16 | 1)


def test_the_deflate_bomb_builder_is_a_real_zlib_stream() -> None:
    assert zlib.decompress(_zeros_deflated(3)) == bytes(3 * MiB)


# ---- pictures ----------------------------------------------------------------------------------------

def _bmp(w: int, h: int, bpp: int = 24, header: int = 40, compression: int = 0, rows: bool = True) -> bytes:
    stride = (w * bpp + 31) // 32 * 4
    pixels = bytes(stride * abs(h)) if rows else b""
    if header == 12:  # OS/2 1.x BITMAPCOREHEADER: 16-bit sizes, no compression field
        info = struct.pack("<IHHHH", 12, w, h, 1, bpp)
    else:
        info = struct.pack("<IiiHHIIiiII", header, w, h, 1, bpp, compression, len(pixels), 2835, 2835, 0, 0)
        info += bytes(header - len(info))
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(pixels), 0, 0, 14 + len(info)) + info + pixels


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def _jpeg(w: int, h: int, sof: int = 0xC0, bits: int = 8, tables: bool = True, scan: bool = True) -> bytes:
    """A JPEG's structure: JFIF, two quantization tables, four one-code Huffman tables, a frame of three
    components, a scan of them, a few bytes of its data."""
    frame = struct.pack(">BHHB", bits, h, w, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    dqt = _segment(0xDB, b"\x00" + bytes(range(1, 65)) + b"\x01" + bytes(range(1, 65)))
    dht = _segment(0xC4, b"".join(bytes([t]) + b"\x01" + bytes(15) + b"\x00" for t in (0x00, 0x10, 0x01, 0x11)))
    sos = _segment(0xDA, b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00") + bytes(40)
    return b"\xff\xd8\xff\xe0\x00\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0" + (dqt + dht if tables else b"") + \
        _segment(sof, frame) + (sos if scan else b"") + b"\xff\xd9"


# ffmpeg's: `ffmpeg -f lavfi -i testsrc=size=16x8:rate=1 -frames:v 1 -pix_fmt yuvj420p -q:v 20 a.jpg`
_FFMPEG_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAgAAAQABAAD//gAPTGF2YzYwLjMuMTAwAP/bAEMACCgoLygvNzc3Nzc3QTxBQ0NDQUFBQUNDQ0hISFVVVUhI"
    "SENDSEhQUFVVXF9cV1dVV19fZGRkeHhzc4yMkaysz//EAGoAAQEBAAAAAAAAAAAAAAAAAAcCBgEBAQAAAAAAAAAAAAAAAAAAAgMQ"
    "AAECBAcBAQAAAAAAAAAAAAEAAjMTESFhUVIE0SIDMUERAAECBQUBAQAAAAAAAAAAAAExERIAUQIDIxPBYQQhIv/AABEIAAgAEAMB"
    "IgACEQADEQD/2gAMAwEAAhEDEQA/AMu3xfIHW5J/RmMUjTmDcg1sK1+6eVbITEePivRw64/XzaihbtlWk2Bf0jGUtBAqlw5n/9k=")


def _webp_lossless(w: int, h: int) -> bytes:
    body = b"\x2f" + struct.pack("<I", (w - 1) | (h - 1) << 14) + bytes(8)
    return b"RIFF" + struct.pack("<I", 4 + 8 + len(body)) + b"WEBPVP8L" + struct.pack("<I", len(body)) + body


# one pixel: a two-colour table, a graphic control extension, the image, its data, the trailer
_GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00"
        b"\x00\x00\x01\x00\x01\x00\x00\x02\x01D\x00;")

REFUSED_PICTURES = {
    # a PNG whose 1×1 header is followed by 64 MiB of pixel data (stb_image would inflate it all)
    "PNG inflating past its header": (_png(1, 1, _zeros_deflated(64)),
                                      "bomb.png is a corrupt PNG: its pixel data inflates to more than 1,048,580 "
                                      "bytes, where its 1×1 header needs 4"),
    "interlaced PNG inflating past its header": (_png(3, 3, _zeros_deflated(8), interlace=1),
                                                 "inflates to more than 1,048,609 bytes, where its 3×3 header "
                                                 "needs 33"),
    "PNG bomb split over many IDAT chunks": (_png(2, 2, [_zeros_deflated(4)[i:i + 999] for i in
                                                         range(0, len(_zeros_deflated(4)), 999)]),
                                             "where its 2×2 header needs 14"),
    "PNG whose deflate data goes bad": (_png(8, 8, zlib.compress(bytes(200))[:6] + b"\xff" * 40),
                                        "bomb.png is a corrupt PNG: its pixel data is not valid deflate data"),
    "PNG of a colour type and depth that do not exist": (_png(4, 4, zlib.compress(bytes(20)), depth=16, kind=3),
                                                         "colour type 3 at 16 bits"),
    # stb_image holds a 16-bit PNG's samples, then an 8-bit copy: 7000×7000 RGBA took a gigabyte
    "16-bit RGBA PNG of 49 megapixels": (_png(7000, 7000, zlib.compress(bytes(100)), depth=16, kind=6),
                                         "bomb.png is a 7000×7000 PNG of 16-bit RGBA: 392 MB of samples decoded, "
                                         "where a picture may take at most 200 MB (50 megapixels of 8-bit RGBA)"),
    "BMP with no pixel rows": (_bmp(7000, 7000, rows=False),
                               "bomb.png is a truncated BMP: its 7000×7000 pixels at 24 bits need 147,000,054 bytes "
                               "and it has 54"),
    "OS/2 BMP": (_bmp(64, 64, header=12), "bomb.png is an OS/2 BMP (12-byte header), which localgen cannot read"),
    "OS/2 2.x BMP": (_bmp(64, 64, header=64), "is an OS/2 BMP (64-byte header)"),
    "RLE BMP": (_bmp(64, 64, bpp=8, compression=1), "is a run-length encoded (RLE) BMP, which localgen cannot read"),
    "BMP holding a PNG": (_bmp(64, 64, compression=5), "is a BMP holding a PNG"),
    "BMP of 2 bits a pixel": (_bmp(64, 64, bpp=2), "(2 bits a pixel, compression 0, 1 planes)"),
    "huge BMP": (_bmp(20000, 20000, rows=False), "is 20000×20000 pixels; an image may have at most 50 megapixels"),
    "GIF cut inside its first picture": (_GIF[:30], "bomb.png is a truncated GIF: it ends inside its first picture"),
    "GIF cut inside its colour table": (_GIF[:15], "is a truncated GIF"),
    "huge GIF": (b"GIF89a" + struct.pack("<HH", 65535, 65535) + bytes(20), "is 65535×65535 pixels"),
    "huge JPEG": (_jpeg(60000, 60000), "is 60000×60000 pixels"),
    "JPEG of 2 megapixels but 20,000 pixels a side": (_jpeg(20000, 100), "is 20000×100 pixels; an image may have at "
                                                                         "most 50 megapixels and 16,384 pixels a side"),
    "BMP one pixel wider than 16,384": (_bmp(16385, 2, rows=False), "is 16385×2 pixels"),
    "lossless JPEG": (_jpeg(64, 64, sof=0xC3), "is a JPEG of a kind localgen cannot read (lossless)"),
    "JPEG cut short": (_jpeg(64, 64)[:-2] + bytes(40), "bomb.png is a truncated JPEG: it ends before its "
                                                        "end-of-image marker"),
    # stb_image decodes these to a grey or garbled picture without a word
    "JPEG with no scan after its frame": (_jpeg(64, 64, scan=False), "bomb.png is a truncated or corrupt JPEG: no "
                                                                     "image data (scan) follows its frame header"),
    "JPEG whose scan uses tables it does not define": (_jpeg(64, 64, tables=False),
                                                       "bomb.png is a corrupt JPEG: its scan uses quantization table 0 "
                                                       "and DC Huffman table 0 and AC Huffman table 0, which it does "
                                                       "not define"),
    "arithmetic-coded JPEG": (_jpeg(64, 64, sof=0xC9), "is a JPEG of a kind localgen cannot read (arithmetic-coded)"),
    "12-bit JPEG": (_jpeg(64, 64, bits=12), "is a JPEG of a kind localgen cannot read (12-bit)"),
    "huge WebP": (_webp_lossless(9000, 7000), "bomb.png is 9000×7000 pixels; an image may have at most 50 megapixels"),
}


@pytest.mark.parametrize("name", list(REFUSED_PICTURES))
def test_a_picture_is_refused_from_its_header_before_decoding(name: str) -> None:
    from localgen import media

    data, words = REFUSED_PICTURES[name]
    with pytest.raises(media.MediaError) as e:
        media.sniff(data, "bomb.png")
    assert words in e.value.message
    assert "\n" not in e.value.message


def test_a_png_bomb_costs_no_memory_to_refuse() -> None:
    """The IDAT stream is inflated a piece at a time and dropped: refusing 64 MiB of pixels costs a few MiB."""
    from localgen import media

    bomb = _png(1, 1, _zeros_deflated(64))
    tracemalloc.start()
    try:
        with pytest.raises(media.MediaError, match="inflates to more than"):
            media.sniff(bomb, "bomb.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB, peak


# every colour type at every depth the PNG standard allows, plain and interlaced, at sizes that leave
# partial bytes and empty Adam7 passes: exactly the pixel data the header implies is accepted (so is a
# little more, which stb_image ignores), and the size is the one libmtmd's decoder takes
KINDS = [(k, d) for k, ds in {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}.items()
         for d in ds]


def _raw_size(w: int, h: int, bits: int, interlace: int) -> int:
    if not interlace:
        return h * (1 + (w * bits + 7) // 8)
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    return sum(len(range(y0, h, dy)) * (1 + (len(range(x0, w, dx)) * bits + 7) // 8)
               for x0, y0, dx, dy in passes if w > x0 and h > y0)


@pytest.mark.parametrize(("kind", "depth"), KINDS)
def test_every_real_png_kind_passes(kind: int, depth: int) -> None:
    from localgen import media

    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[kind]
    for interlace in (0, 1):
        for w, h in ((1, 1), (3, 5), (13, 17), (9, 2)):
            size = _raw_size(w, h, channels * depth, interlace)
            for extra in (0, 100):
                data = _png(w, h, zlib.compress(bytes(size + extra)), depth, kind, interlace, palette=kind == 3)
                m = media.sniff(data, "ok.png")
                assert (m.format, m.width, m.height) == ("PNG", w, h)


def test_real_pictures_pass() -> None:
    from localgen import media

    assert media.sniff(png(96, 64), "a.png").width == 96
    assert (media.sniff(_bmp(33, -7), "a.bmp").width, media.sniff(_bmp(33, -7), "a.bmp").height) == (33, 7)
    assert media.sniff(_bmp(5, 5, bpp=1), "a.bmp").format == "BMP"
    assert media.sniff(_bmp(5, 5, bpp=32, compression=3, header=124), "a.bmp").format == "BMP"
    assert media.sniff(_jpeg(640, 480, sof=0xC2), "a.jpg").width == 640
    assert (media.sniff(_FFMPEG_JPEG, "a.jpg").width, media.sniff(_FFMPEG_JPEG, "a.jpg").height) == (16, 8)
    assert media.sniff(_GIF, "a.gif").width == media.sniff(_GIF[:-1], "a.gif").width == 1  # no trailer: all there


# ---- sounds ------------------------------------------------------------------------------------------

def _wav(codec: int, rate: int, block: int, bits: int, data: bytes, channels: int = 1, ext: bytes = b"") -> bytes:
    fmt = struct.pack("<HHIIHH", codec, channels, rate, rate * block, block, bits) + ext
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _ima_adpcm(seconds: float, rate: int = 8000) -> bytes:
    """IMA ADPCM: 256-byte blocks of 505 samples each (4 bits a sample after a 4-byte header)."""
    blocks = int(seconds * rate / 505) + 1
    return _wav(0x11, rate, 256, 4, bytes(256 * blocks), ext=struct.pack("<HH", 2, 505))


def _flac(total: int, rate: int = 8000) -> bytes:
    info = struct.pack(">HH", 4096, 4096) + bytes(6) + ((rate << 44) | (7 << 36) | total).to_bytes(8, "big")
    return b"fLaC" + b"\x80" + (len(info) + 16).to_bytes(3, "big") + info + bytes(16)


FRAME = b"\xff\xe3\x18\xc0" + bytes(68)  # MPEG-2.5 layer III, 8 kbit/s, 8 kHz, mono: 72 bytes, 72 ms, silent


def _xing(frames: int) -> bytes:
    f = bytearray(FRAME)
    f[13:25] = b"Xing" + struct.pack(">II", 1, frames)  # after 4 bytes of header and 9 of side information
    return bytes(f)


def _id3(size: int) -> bytes:
    return b"ID3\x04\x00\x00" + bytes((size >> s) & 0x7F for s in (21, 14, 7, 0)) + bytes(size)


def _xing_crc(frames: int) -> bytes:
    """MPEG-2.5 layer III frames with a CRC (64 kbit/s, 8 kHz, stereo: 576 bytes, 576 samples each), the first
    holding a Xing tag after its header, its 2-byte CRC and 17 bytes of side information."""
    head = b"\xff\xe2\x88\x00"
    first = head + bytes(19) + b"Xing" + struct.pack(">II", 1, frames)
    return first + bytes(576 - len(first)) + (head + bytes(572)) * 12


REFUSED_SOUNDS = {
    "IMA ADPCM WAV (its blocks hold 505 samples each)": (_ima_adpcm(700), "clip is 11.7 minutes of audio; at most "
                                                                          "10 minutes are taken"),
    "PCM WAV whose block alignment is not its frame size": (_wav(1, 8000, 4096, 8, bytes(8000 * 660)),
                                                            "is 11.0 minutes of audio"),
    "WAV of a codec miniaudio cannot read": (_wav(0x55, 8000, 1, 8, bytes(100)),
                                             "clip is a WAV in a codec localgen cannot read (format 0x0055)"),
    "WAV cut short (a download that stopped)": (_wav(1, 8000, 1, 8, bytes(8000))[:-3000],
                                                "clip is a truncated WAV: its data chunk promises 8,000 bytes and "
                                                "5,000 are there"),
    "FLAC longer than its limit": (_flac(8000 * 700), "is 11.7 minutes of audio"),
    "FLAC that does not give its length": (_flac(0), "clip is a FLAC that does not give its length"),
    "MP3 of more frames than ten minutes": (FRAME * 8400, "clip is more than 10.0 minutes of audio; at most 10 "
                                                          "minutes are taken"),
    "MP3 behind an ID3 tag": (_id3(3000) + FRAME * 8400, "is more than 10.0 minutes"),
    "MP3 whose Xing header claims hours": (_xing(2**20) + FRAME * 10, "clip is 1258.3 minutes of audio"),
    "MP3 whose Xing header claims a second but holds more": (_xing(14) + FRAME * 8400, "is more than 10.0 minutes"),
    # miniaudio reads the Xing tag past a frame's CRC: 2**32 samples (its buffer's size) from 7 kB
    "MP3 with a CRC whose Xing header claims 2**32 samples": (_xing_crc(2**32 // 576),
                                                              "clip is 8947.8 minutes of audio"),
    "MP3 with a CRC whose Xing header claims an hour": (_xing_crc(8000 * 3600 // 576), "clip is 60.0 minutes"),
    "MP3 whose Xing frame follows a false one": (FRAME[:20] + _xing(2**20) + FRAME * 10, "is 1258.3 minutes"),
    # what miniaudio's WAV or FLAC reader refuses its decoder reads as MP3, believing a Xing tag
    "WAV holding an MP3 frame whose Xing header claims hours": (_wav(1, 8000, 1, 8, _xing(2**20) + bytes(100)),
                                                                "clip is 1258.3 minutes of audio"),
    "FLAC whose STREAMINFO block is not 34 bytes": (_flac(8000)[:5] + b"\x00\x00\x23" + _flac(8000)[8:] + bytes(1),
                                                    "clip is a truncated or corrupt FLAC (no STREAMINFO block)"),
    "FLAC behind an ID3 tag (miniaudio's FLAC reader skips it)": (_id3(100) + _flac(8000 * 700),
                                                                  "clip is 11.7 minutes of audio"),
    # miniaudio counts an ADPCM clip's frames from its data's size less 6 (MS) or 4 (IMA) bytes a block and
    # channel, unsigned: blocks smaller than that wrap around to 1.8e19 frames (std::length_error: an abort)
    "MS ADPCM WAV whose blocks are smaller than their headers": (_wav(2, 16000, 1, 4, bytes(3200)),
                                                                 "clip is a corrupt MS ADPCM WAV: its blocks are 1 "
                                                                 "bytes, where their headers take 7"),
    "IMA ADPCM WAV whose blocks are smaller than their headers": (_wav(0x11, 16000, 3, 4, bytes(3201), channels=2),
                                                                  "clip is a corrupt IMA ADPCM WAV: its blocks are 3"),
    "ADPCM WAV whose data is shorter than one block's header": (_wav(2, 16000, 256, 4, bytes(5)),
                                                                "its data (5 bytes) is shorter than its blocks' "
                                                                "headers"),
    "ADPCM WAV of 3 channels (miniaudio reads 1 or 2)": (_wav(2, 16000, 256 * 3, 4, bytes(768), channels=3),
                                                        "clip is a corrupt MS ADPCM WAV"),
    # what miniaudio's WAV reader refuses it would try as FLAC and MP3, which this WAV's check does not bound
    "WAV at a sample rate miniaudio refuses": (_wav(1, 2**31 - 1, 1, 8, bytes(3200)),
                                               "clip is a corrupt PCM WAV: 1 channel of 8 bits at 2,147,483,647 Hz"),
    "WAV of 300 channels": (_wav(1, 16000, 600, 16, bytes(6000), channels=300), "300 channels of 16 bits"),
    "µ-law WAV of 16 bits a sample": (_wav(7, 8000, 2, 16, bytes(800)), "clip is a corrupt µ-law WAV"),
}


@pytest.mark.parametrize("name", list(REFUSED_SOUNDS))
def test_a_sound_is_refused_from_its_header_before_decoding(name: str) -> None:
    from localgen import media

    data, words = REFUSED_SOUNDS[name]
    with pytest.raises(media.MediaError) as e:
        media.sniff(data, "clip")
    assert words in e.value.message


def test_real_sounds_pass_with_their_length() -> None:
    from localgen import media

    assert media.sniff(wav(1.5), "a.wav").seconds == pytest.approx(1.5)
    assert media.sniff(_ima_adpcm(60), "a.wav").seconds == pytest.approx(60, abs=0.1)
    assert media.sniff(_flac(8000 * 30), "a.flac").seconds == pytest.approx(30)
    assert media.sniff(FRAME * 1000, "a.mp3").seconds == pytest.approx(72)
    assert media.sniff(_id3(100) + FRAME * 1000, "a.mp3").seconds == pytest.approx(72)
    assert media.sniff(_xing(500) + FRAME * 500, "a.mp3").seconds == pytest.approx(36)
    streamed = bytearray(_wav(1, 8000, 1, 8, bytes(16000)))
    streamed[-16004:-16000] = b"\xff\xff\xff\xff"  # a stream's WAV: its data's length unknown, to the end
    assert media.sniff(bytes(streamed), "a.wav").seconds == pytest.approx(2)


def test_a_hostile_file_costs_few_steps() -> None:
    """Loops over a file's structure are capped: 8 MiB of empty chunks or segments is one quick refusal."""
    from localgen import media

    cases = [(b"\xff\xd8" + b"\xff\xfe\x00\x02" * (2 * MiB), "no frame header"),
             (_png(1, 1, b"")[:33] + _chunk(b"tEXt", b"") * (700_000), "more than 100,000 chunks"),
             (b"RIFF\0\0\0\0WAVE" + b"junk\0\0\0\0" * MiB, "no fmt or data chunk")]
    for data, words in cases:
        with pytest.raises(media.MediaError, match=words):
            media.sniff(data, "x")


# ---- every way in: run's files, serve's parts --------------------------------------------------------

def test_serve_and_chat_parts_are_bounded_too() -> None:
    """serve's image_url and input_audio parts (and a chat file's) go through the same checks."""
    from localgen import media

    bomb = base64.b64encode(_png(1, 1, _zeros_deflated(16))).decode()
    with pytest.raises(media.MediaError, match=r"^data URI is a corrupt PNG: its pixel data inflates"):
        media.part_media({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{bomb}"}})
    long_mp3 = base64.b64encode(FRAME * 8400).decode()
    with pytest.raises(media.MediaError, match=r"^base64 data is more than 10\.0 minutes of audio"):
        media.part_media({"type": "input_audio", "input_audio": {"data": long_mp3, "format": "mp3"}})


def test_run_refuses_a_bomb_by_its_name(tmp_path: Path) -> None:
    from localgen import media

    path = tmp_path / "bomb.png"
    path.write_bytes(_png(1, 1, _zeros_deflated(16)))
    with pytest.raises(media.MediaError, match=f"^{re.escape(str(path))} is a corrupt PNG"):
        media.read(str(path))
    with pytest.raises(media.MediaError, match=f"^no such file: {re.escape(str(tmp_path / 'missing.wav'))}$"):
        media.read(str(tmp_path / "missing.wav"))


def _peak_rss_mib(cli: CLI, args: list[str], tmp_path: Path) -> tuple[float, int, str]:
    """The child's own peak resident memory (wait4's rusage), its exit code and its stderr."""
    with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err:
        p = subprocess.Popen(cli.argv(*args), env=cli.env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, p.returncode, (tmp_path / "err").read_text()


def test_run_refuses_a_png_bomb_within_100_mib(cli: CLI, tmp_path: Path) -> None:
    """`run --image` with a PNG whose 1×1 header hides 400 MiB of pixels: the same peak memory, give or take
    100 MiB, as refusing a truncated PNG, one line naming the file, exit 2."""
    proj = write_mmproj(tmp_path / "proj.gguf")
    bomb, cut = tmp_path / "bomb.png", tmp_path / "cut.png"
    bomb.write_bytes(_png(1, 1, _zeros_deflated(400)))
    cut.write_bytes(png(8, 8)[:40])
    base, code, err = _peak_rss_mib(cli, ["run", "--mmproj", str(proj), "--image", str(cut), "-p", "Hi", "-n", "1"],
                                    tmp_path)
    assert code == 2 and "is a truncated PNG" in err, err
    peak, code, err = _peak_rss_mib(cli, ["run", "--mmproj", str(proj), "--image", str(bomb), "-p", "Hi", "-n", "1"],
                                    tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"{bomb} is a corrupt PNG: its pixel data inflates" in lines[0], err
    assert peak - base < 100, (peak, base)


def test_run_refuses_a_clip_that_would_abort_the_decoder(cli: CLI, tmp_path: Path) -> None:
    """Files whose length miniaudio computes as some 1.8e19 frames (an ADPCM WAV whose blocks are smaller than
    their headers) or 2**32 samples (an MP3's Xing tag behind a CRC) once aborted the process in libmtmd
    (std::length_error, std::bad_alloc): one line naming the file, exit 2, nothing on stdout."""
    proj = write_audio_mmproj(tmp_path / "audio.gguf")
    files = {"tiny.wav": (_wav(2, 16000, 1, 4, bytes(3200)), "is a corrupt MS ADPCM WAV"),
             "odd.wav": (_wav(0x11, 16000, 3, 4, bytes(3201), channels=2), "is a corrupt IMA ADPCM WAV"),
             "crc.mp3": (_xing_crc(2**32 // 576), "is 8947.8 minutes of audio")}
    for name, (data, words) in files.items():
        (tmp_path / name).write_bytes(data)
        r = cli("run", "--mmproj", str(proj), "-a", str(tmp_path / name), "-p", "hi", "-n", "2")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and f"{tmp_path / name} {words}" in lines[0], r.stderr
        assert r.stdout == ""


def test_libmtmd_gets_no_clip_whose_length_its_header_did_not_bound(smollm2_engine: Any, tmp_path: Path) -> None:
    """libmtmd's helper allocates whatever length miniaudio computes: a clip reaches it only with the length its
    header gave, within the bound (here 10.8 minutes of MP3 frames, made without media.sniff: refused as
    unread, where the helper decoded it all before the length was checked)."""
    import dataclasses

    from localgen import media
    from localgen.engine.local import LocalBackend

    eng = smollm2_engine
    eng.model = dataclasses.replace(eng.model, mmproj=str(write_audio_mmproj(tmp_path / "audio.gguf")))
    backend = LocalBackend(eng)
    try:
        projector = backend.projector()
        unread = media.Media("audio", "MP3", FRAME * 9000, "x.mp3")
        with pytest.raises(media.MediaError, match=r"^x\.mp3 is a corrupt or unreadable MP3 audio$"):
            projector.tokenize(projector.marker, [unread], add_special=True)
        too_long = dataclasses.replace(unread, seconds=648.0)
        with pytest.raises(media.MediaError, match=r"^x\.mp3 is 10\.8 minutes of audio"):
            projector.tokenize(projector.marker, [too_long], add_special=True)
    finally:
        if backend._projector is not None:
            backend._projector.close()
        eng.model = dataclasses.replace(eng.model, mmproj=None)


def test_a_literal_media_marker_in_the_text_is_text(cli: CLI, tmp_path: Path) -> None:
    """libmtmd splits the prompt at its marker: each projector has one of its own, so `<__media__>` typed
    by a user (or sent to serve) is words, not a second attachment."""
    proj = write_mmproj(tmp_path / "proj.gguf")
    pic = tmp_path / "pic.png"
    pic.write_bytes(png(32, 32))
    r = cli("run", "--mmproj", str(proj), "--image", str(pic), "-p", "What does <__media__> mean?", "-n", "2")
    assert r.returncode == 0 and "marker" not in r.stderr, r.stderr
