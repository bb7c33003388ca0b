"""The audio header readers behind media.sniff: a WAV's, FLAC's or MP3's length read from the bytes as
miniaudio, libmtmd's audio decoder, will compute it, with the checks that bound what it will spend on them.
Stdlib only; nothing here decodes samples."""

from __future__ import annotations

import re
import struct
from typing import Any

from localgen.media_headers import MAX_AUDIO_S, MAX_STEPS, MediaError, check_seconds

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
        if block <= head:
            raise MediaError(f"{corrupt}: its blocks are {block} bytes, where their headers take {head}")
        if channels > 2:
            raise MediaError(f"{corrupt}: {channels} channels, where ADPCM has 1 or 2")
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
