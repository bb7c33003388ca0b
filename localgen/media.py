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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from localgen.errors import UsageError

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
        if len(data) < 33 or data[12:16] != b"IHDR":
            raise MediaError(f"{source} is a truncated or corrupt PNG")
        w, h = struct.unpack(">II", data[16:24])
        image = _image("PNG", data, source, w, h)
        if _PNG_END not in data:  # libmtmd's decoder (stb_image) reads chunks up to this one
            raise MediaError(f"{source} is a truncated PNG: it ends before its IEND chunk")
        return image
    if head.startswith(b"\xff\xd8\xff"):
        w, h = _jpeg_size(data, source)
        return _image("JPEG", data, source, w, h)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 13:
            raise MediaError(f"{source} is a truncated or corrupt GIF")
        w, h = struct.unpack("<HH", data[6:10])
        return _image("GIF", data, source, w, h)
    if head.startswith(b"BM") and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return _image("BMP", data, source, abs(w), abs(h))
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return _audio("WAV", data, source, _wav_seconds(data, source))
    if head.startswith(b"fLaC"):
        return _audio("FLAC", data, source, _flac_seconds(data))
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return _audio("MP3", data, source, None)
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


def check_seconds(seconds: float, source: str) -> None:
    """A MediaError for audio longer than MAX_AUDIO_S."""
    if seconds > MAX_AUDIO_S:
        raise MediaError(f"{source} is {seconds / 60:.1f} minutes of audio; at most {MAX_AUDIO_S / 60:.0f} "
                         "minutes are taken", hint="cut it into shorter pieces")


def _jpeg_size(data: bytes, source: str) -> tuple[int, int]:
    """Width and height from the first start-of-frame marker."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
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
            if i + 9 > n:
                break
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        if length < 2:
            break
        i += 2 + length
    raise MediaError(f"{source} is a truncated or corrupt JPEG (no frame header)")


def _wav_seconds(data: bytes, source: str) -> float:
    """The length of a WAV file from its fmt and data chunks."""
    i, rate, block = 12, 0, 0
    while i + 8 <= len(data):
        cid, size = data[i:i + 4], struct.unpack("<I", data[i + 4:i + 8])[0]
        if cid == b"fmt " and i + 24 <= len(data):
            _, _, rate, _, block = struct.unpack("<HHIIH", data[i + 8:i + 22])
        elif cid == b"data":
            if not rate or not block:
                break
            size = min(size, len(data) - i - 8) if size != 0xFFFFFFFF else len(data) - i - 8
            return size / block / rate
        i += 8 + size + (size & 1)
    raise MediaError(f"{source} is a truncated or corrupt WAV (no fmt or data chunk)")


def _flac_seconds(data: bytes) -> float | None:
    """The length from FLAC's STREAMINFO block, when it says (0 samples: unknown)."""
    if len(data) < 8 + 18:
        return None
    info = int.from_bytes(data[18:26], "big")  # after 10 bytes of block and frame sizes
    rate = info >> 44
    total = info & ((1 << 36) - 1)
    return total / rate if rate and total else None


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


def fetch(url: str, timeout: float = 30.0) -> Media:
    """The bytes at an http(s) URL (at most MAX_BYTES)."""
    import httpx

    try:
        with httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as r:
            if r.status_code != 200:
                raise MediaError(f"{url} answered HTTP {r.status_code}")
            buf = bytearray()
            for piece in r.iter_bytes():
                buf += piece
                if len(buf) > MAX_BYTES:
                    raise MediaError(f"{url} is larger than {MAX_BYTES // 2**20} MiB")
    except httpx.HTTPError as e:
        raise MediaError(f"cannot fetch {url}: {e}") from None
    return sniff(bytes(buf), url)


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
        return fetch(url)
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
