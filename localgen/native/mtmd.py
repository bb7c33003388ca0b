"""Images, audio and video through llama.cpp's libmtmd: a projector (mmproj) loaded beside an Engine's model turns
a rendered prompt with media markers and its media into a Prompt: the text tokens, and for each image or
clip a run of placeholder ids (one per position it takes) that the KV record holds like tokens. A
placeholder is derived from the media's SHA-256 and the projector file, so a conversation's second turn finds
its image already in the cache and does not encode it again, and another projector's never does. A video is
libmtmd's helper's: ffmpeg (media.ffmpeg_dir) runs as the prompt is tokenized, its frames becoming image
chunks with `[0m5.00s]` timestamps between them; its frames are counted (ffprobe) and bounded by the context
before any is read. Spans evaluate themselves (encode, then decode the embeddings) into any context and
sequence: the single stream (Engine.kv.evaluate) and the batch slots (engine/batch.py). Bindings glue only:
the Engine hands it its model pointer."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from localgen.errors import LocalgenError, ModelLoadError
from localgen.media import VIDEO_FPS, Media, MediaError, check_seconds, ffmpeg_dir, no_ffmpeg
from localgen.native import logs
from localgen.native.prompt import MediaSpan, Prompt

_CHUNK_TEXT, _CHUNK_IMAGE, _CHUNK_AUDIO = 0, 1, 2


def available() -> str | None:
    """None when this llama-cpp-python build has libmtmd, else why not."""
    try:
        from localgen.native.lib import lib

        lib()
        _bindings()
    except (ImportError, OSError, FileNotFoundError, RuntimeError) as e:
        return f"libmtmd is not in this llama-cpp-python build ({str(e).splitlines()[0][:120]})"
    return None


def _bindings() -> Any:
    """llama_cpp.mtmd_cpp, imported as a submodule (`from llama_cpp import` would reach the package's high-level
    modules through native/lib.py's stand-in, and they install a logger that prints to stderr)."""
    import importlib

    return importlib.import_module("llama_cpp.mtmd_cpp")


def placeholder(media_id: str, projector: str) -> int:
    """The id a media chunk's positions hold in the KV record: negative (never a vocabulary token). It is a
    hash of the media's id and of `projector` (the projector file's identity): another projector makes other
    embeddings of the same picture, so a cached, stored or saved state of one is never taken for the other's.
    A video frame's id (`{sha256}+{frame}@{fps}`) is hashed whole: its frames, and the same video at another
    rate, must not share one."""
    value = int(hashlib.sha256(f"{projector}|{media_id}".encode()).hexdigest()[:8], 16)
    return -1 - (value & 0x3FFFFFFF)


def _projector_identity(path: str, fresh: bool = False) -> str:
    """A projector file as the states computed with it depend on it: its real path, size, modification time and a
    sample of its bytes (localgen/fileid.py, as engine/llama.py's identity takes the model file's: a file rewritten
    with its old mtime set back is another projector; a new hard link or a chmod is not)."""
    from localgen import fileid

    return fileid.identity(path, fresh)


@dataclass
class Span:
    """One media chunk of a Prompt: `n_pos` positions from its start, `n_tokens` embeddings."""

    projector: Projector
    chunk: Any  # mtmd_input_chunk pointer, owned by the Prompt's chunks
    kind: str
    n_pos: int
    n_tokens: int

    def evaluate(self, lctx: Any, n_past: int, seq_id: int, n_batch: int) -> float:
        """Encode the media and decode its embeddings at `n_past` in `seq_id` (it then takes `n_pos`
        positions); returns the seconds the encoder took."""
        mt, ctx = self.projector.mt, self.projector.ctx
        t0 = time.perf_counter()
        rc = mt.mtmd_encode_chunk(ctx, self.chunk)
        logs.raise_deferred()
        encode_s = time.perf_counter() - t0
        if rc != 0:
            raise LocalgenError(f"libmtmd could not encode the {self.kind} ({rc})", hint=logs.first_error())
        embd = mt.mtmd_get_output_embd(ctx)
        new = ctypes.c_int32(0)
        rc = mt.mtmd_helper_decode_image_chunk(ctx, lctx, self.chunk, embd, n_past, seq_id, n_batch,
                                               ctypes.byref(new), mt.mtmd_helper_post_decode_callback(), None)
        logs.raise_deferred()
        if rc != 0:
            raise LocalgenError(f"llama_decode failed on the {self.kind}'s embeddings ({rc})",
                                hint="the context may be full; raise --ctx")
        return encode_s


@dataclass
class _Chunks:
    """Owns an mtmd_input_chunks; freed with the last Prompt that uses it."""

    mt: Any
    ptr: Any

    def __del__(self) -> None:
        if self.ptr:
            self.mt.mtmd_input_chunks_free(self.ptr)
            self.ptr = None


class Projector:
    """A multimodal projector loaded for one model (a llama_model pointer)."""

    def __init__(self, model_ptr: Any, path: str, n_threads: int, flash_attn: bool, use_gpu: bool = True) -> None:
        self.mt = mt = _bindings()
        self.path = path
        if logs._callback is not None:  # route clip's and mtmd's log lines through ours (quiet unless --verbose)
            mt.mtmd_helper_log_set(logs._callback, ctypes.c_void_p(0))
        p = mt.mtmd_context_params_default()
        p.use_gpu = use_gpu
        p.print_timings = False
        p.n_threads = n_threads
        p.flash_attn_type = int(bool(flash_attn))
        # a marker of this projector's own, so that a literal `<__media__>` in someone's text stays text
        self.marker = f"<__media_{secrets.token_hex(8)}__>"
        p.media_marker = self.marker.encode()
        logs.clear()
        t0 = time.perf_counter()
        self.ctx = mt.mtmd_init_from_file(os.fsencode(path), model_ptr, p)
        logs.raise_deferred()
        if not self.ctx:
            raise ModelLoadError(f"libmtmd could not load the projector {path}: {logs.first_error() or 'failed'}",
                                 log=logs.lines())
        self.load_s = time.perf_counter() - t0
        self.identity = _projector_identity(path, fresh=True)
        self.vision = bool(mt.mtmd_support_vision(self.ctx))
        self.audio = bool(mt.mtmd_support_audio(self.ctx))
        self.sample_rate = int(mt.mtmd_get_audio_sample_rate(self.ctx)) if self.audio else 0
        self.n_ctx = 0  # the context a video's frames must fit (set by the engine; 0: unbounded here)
        self._cache: OrderedDict[tuple[Any, ...], Prompt] = OrderedDict()
        self._lock = threading.Lock()  # serve makes prompts in a media thread (serve/prepare.py)

    def check(self, media: list[Media], model: str) -> None:
        """A MediaError for media this projector does not read."""
        for m in media:
            if m.kind == "image" and not self.vision:
                raise MediaError(f"{model}'s projector reads audio, not images ({m.label()})")
            if m.kind == "audio" and not self.audio:
                raise MediaError(f"{model}'s projector reads images, not audio ({m.label()})")
            if m.kind == "video" and not self.vision:
                raise MediaError(f"{model}'s projector reads audio, not video ({m.label()})")
            if m.kind == "video" and not self.mt.mtmd_helper_support_video(self.ctx):
                raise MediaError(f"this llama-cpp-python's libmtmd was built without video ({m.label()})")

    def tokenize(self, text: str, media: list[Media], add_special: bool) -> Prompt:
        """The prompt with its media as chunks. The last few are kept, so counting a chat's window and then
        generating from it tokenizes (and preprocesses its images) once."""
        key = (text, tuple((m.sha256, m.fps) for m in media), add_special)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            prompt = self._tokenize(text, media, add_special)
            self._cache[key] = prompt
            while len(self._cache) > 4:
                self._cache.popitem(last=False)
            return prompt

    def _tokenize(self, text: str, media: list[Media], add_special: bool) -> Prompt:
        mt, ctx = self.mt, self.ctx
        found = text.count(self.marker)
        if found != len(media):
            raise MediaError(f"the prompt has {found} media marker{'s' if found != 1 else ''} "
                             f"({self.marker}) for {len(media)} attachment{'s' if len(media) != 1 else ''}")
        bitmaps: list[Any] = []
        videos: list[Any] = []  # the helper's video contexts: ffmpeg runs until each is freed
        frames: list[tuple[Media, int, float, float]] = []  # each video's frames, rate and tokens a frame
        try:
            for m in media:
                bitmaps.append(self._bitmap(m, videos, frames))
            self._check_frames(frames)
            owner = _Chunks(mt, mt.mtmd_input_chunks_init())
            data = text.encode("utf-8")
            inp = mt.mtmd_input_text(text=data, text_len=len(data), add_special=add_special, parse_special=True)
            arr = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = mt.mtmd_tokenize(ctx, owner.ptr, ctypes.byref(inp), arr, len(bitmaps))  # reads the videos' frames
            logs.raise_deferred()
        finally:  # also on Ctrl-C: each ffmpeg is stopped and reaped
            for b in bitmaps:
                mt.mtmd_bitmap_free(b)
            for v in videos:
                mt.mtmd_helper_video_free(v)
        if rc == 2 and frames:
            names = ", ".join(m.source for m, *_ in frames)
            raise MediaError(f"libmtmd could not read the frames of {names}: {logs.first_error() or 'failed'}")
        if rc == 2:
            raise MediaError(f"libmtmd could not preprocess the image: {logs.first_error() or 'failed'}")
        if rc != 0:
            raise MediaError(f"libmtmd could not tokenize the prompt ({rc}): {logs.first_error() or 'failed'}")
        tokens: list[int] = []
        spans: dict[int, MediaSpan] = {}
        read: set[str] = set()  # the media that gave chunks (a video whose ffmpeg read no frame gives none)
        for i in range(mt.mtmd_input_chunks_size(owner.ptr)):
            chunk = mt.mtmd_input_chunks_get(owner.ptr, i)
            kind = mt.mtmd_input_chunk_get_type(chunk)
            if kind == _CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                ptr = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ptr[:n.value])
                continue
            n_pos = int(mt.mtmd_input_chunk_get_n_pos(chunk))
            n_tok = int(mt.mtmd_input_chunk_get_n_tokens(chunk))
            media_id = (mt.mtmd_input_chunk_get_id(chunk) or b"0").decode()
            read.add(media_id.split("+")[0])
            if "+" in media_id:  # a video's frame: the same frame number at another rate is another picture
                fps = next((m.fps or VIDEO_FPS for m in media if media_id.startswith(m.sha256)), VIDEO_FPS)
                media_id = f"{media_id}@{fps:g}"
            spans[len(tokens)] = Span(self, chunk, "audio" if kind == _CHUNK_AUDIO else "image", n_pos, n_tok)
            tokens.extend([placeholder(media_id, self.identity)] * n_pos)
        for m, *_ in frames:
            if m.sha256 not in read:
                raise MediaError(f"{m.source} is a corrupt or unreadable {m.format} video: ffmpeg read no frame of it")
        return Prompt(tokens, MappingProxyType(spans), owner)

    def _bitmap(self, m: Media, videos: list[Any], frames: list[tuple[Media, int, float, float]]) -> Any:
        """The media's bitmap; a video's is lazy (its frames are read as the prompt is tokenized): its video
        context goes into `videos` (the caller frees it), its frames, rate and tokens a frame into `frames`."""
        mt = self.mt
        opt = mt.mtmd_helper_init_opt_default()
        folder = None
        if m.kind == "video" or m.format == "WebP":
            folder = ffmpeg_dir()
            if folder is None:
                raise no_ffmpeg(f"{m.source} is {m.format} {m.kind}: reading it")
            opt.video_params.ffmpeg_bin_dir = os.fsencode(folder)
            opt.video_params.fps_target = m.fps or VIDEO_FPS
        if m.kind == "audio":  # libmtmd's helper allocates the length miniaudio computes, unchecked (an abort
            # past the machine's memory): only a clip whose header bounded that length goes in
            if m.seconds is None:
                raise MediaError(f"{m.source} is a corrupt or unreadable {m.format} {m.kind}")
            check_seconds(m.seconds, m.source)
        buf = (ctypes.c_uint8 * len(m.data)).from_buffer_copy(m.data)
        out = mt.mtmd_helper_bitmap_init_from_buf_wrapper(self.ctx, buf, len(m.data), False, opt)
        bmp = out.bitmap
        if out.video_ctx:
            videos.append(out.video_ctx)
        logs.raise_deferred()
        if not bmp:
            raise MediaError(f"{m.source} is a corrupt or unreadable {m.format} {m.kind}")
        if out.video_ctx:
            if m.kind != "video":  # a file sniffed as an image or audio that only ffmpeg could read
                mt.mtmd_bitmap_free(bmp)
                raise MediaError(f"{m.source} is a corrupt or unreadable {m.format} {m.kind}")
            info = mt.mtmd_helper_video_get_info(out.video_ctx)
            frames.append((m, int(info.n_frames), float(info.fps), self._frame_tokens(int(info.width),
                                                                                      int(info.height))))
            return bmp
        if m.kind == "audio" and self.sample_rate:
            seconds = mt.mtmd_bitmap_get_n_bytes(bmp) / 4 / self.sample_rate  # mono float samples
            try:
                check_seconds(seconds, m.source)
            except MediaError:
                mt.mtmd_bitmap_free(bmp)
                raise
        mt.mtmd_bitmap_set_id(bmp, m.sha256[:16].encode())
        return bmp

    def _frame_tokens(self, width: int, height: int) -> float:
        """The context one frame of width×height takes: two blank mergeable frames tokenized (a model that
        merges frames in pairs, as Qwen-VL's, gives both one chunk)."""
        mt, ctx = self.mt, self.ctx
        if not width or not height:
            return 0.0
        owner = _Chunks(mt, mt.mtmd_input_chunks_init())
        pixels = (ctypes.c_uint8 * (width * height * 3))()
        bmps = [mt.mtmd_bitmap_init(width, height, pixels) for _ in range(2)]
        try:
            for b in bmps:
                mt.mtmd_bitmap_set_mergeable(b, True)
            data = (self.marker * 2).encode()
            inp = mt.mtmd_input_text(text=data, text_len=len(data), add_special=False, parse_special=True)
            arr = (mt.mtmd_bitmap_p_ctypes * 2)(*bmps)
            rc = mt.mtmd_tokenize(ctx, owner.ptr, ctypes.byref(inp), arr, 2)
            logs.raise_deferred()
        finally:
            for b in bmps:
                mt.mtmd_bitmap_free(b)
        if rc != 0:
            return 0.0  # the frames' own tokenizing will say what is wrong
        # the KV cells the embeddings take, or the positions (M-RoPE's differ): whichever is more
        return max(int(mt.mtmd_helper_get_n_tokens(owner.ptr)), int(mt.mtmd_helper_get_n_pos(owner.ptr))) / 2

    def _check_frames(self, frames: list[tuple[Media, int, float, float]]) -> None:
        """A MediaError, before any frame is read, for videos whose frames cannot fit the context."""
        if not self.n_ctx or not frames:
            return
        need = sum(n * per for _, n, _, per in frames if n > 0)
        if need <= self.n_ctx:
            return
        m, n, fps, _ = max(frames, key=lambda f: f[1] * f[3])
        what = (f"{m.source} is {n:,} frames at {fps:g} a second" if len(frames) == 1 else
                f"the videos are {sum(max(f[1], 0) for f in frames):,} frames")
        raise MediaError(f"{what}, which take {round(need):,} tokens of context; --ctx-size is {self.n_ctx:,}",
                         hint="lower --video-fps, cut the video shorter, or raise --ctx-size")

    def close(self) -> None:
        with self._lock:
            self._cache.clear()
        with logs.unbroken():  # a Ctrl-C between the two would have __del__ free it again
            if getattr(self, "ctx", None):
                self.mt.mtmd_free(self.ctx)
                self.ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception), logs.finalising():  # (Engine.__del__'s); interpreter shutdown
            self.close()
