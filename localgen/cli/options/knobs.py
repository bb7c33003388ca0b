"""The generation and load settings a command took (Knobs), typed by the tables (settings.py, loadsettings.py): the
sampling and load parameters derived from them, which the user set, and --lora's adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from localgen.cli.inputfile import env_source
from localgen.errors import UsageError
from localgen.loadsettings import LOAD_KNOBS
from localgen.settings import KNOBS
from localgen.types import LoadParams, SamplingParams


@dataclass(frozen=True)
class Knobs:
    """The generation and load settings a command took, typed by the tables (settings.py, loadsettings.py), and which of
    them the user set (command line or environment) as opposed to their defaults."""

    values: Mapping[str, Any]
    given_names: frozenset[str]
    # of those, the ones typed on the command line (not from an environment variable such as llama.cpp's
    # LLAMA_ARG_*, which a user may export for every local load)
    typed_names: frozenset[str] | None = None
    # of those, the ones an environment variable gave → that variable, which their errors name
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: typer.Context, values: Mapping[str, Any], params: Mapping[str, str] | None = None) -> Knobs:
        """The settings among a command's parameters (`params`: a setting's parameter where the command names it
        otherwise, as embed's ctx_size)."""
        names = [n for n in values if n in KNOBS or n in LOAD_KNOBS]
        param = {n: (params or {}).get(n, n) for n in names}
        env = {n: var for n in names if (var := env_source(ctx, param[n])) is not None}
        return cls({n: values[n] for n in names}, frozenset(n for n in names if given_by_user(ctx, param[n])),
                   frozenset(n for n in names if typed_by_user(ctx, param[n])), env)

    def given(self, name: str) -> bool:
        return name in self.given_names

    def typed(self, name: str) -> bool:
        """Whether the user typed this setting on the command line (None typed_names: as `given`)."""
        return name in (self.given_names if self.typed_names is None else self.typed_names)

    def named(self, name: str) -> str:
        """Where the user wrote a load setting, as its errors name it: the environment variable that gave it
        (LLAMA_ARG_OVERRIDE_TENSOR), else its flag (--override-tensor)."""
        return self.env.get(name) or LOAD_KNOBS[name].flags[0].split("/")[0]

    def get(self, name: str, default: Any = None) -> Any:
        """A setting's value as the command took it, or `default` where the command does not take it."""
        return self.values.get(name, default)

    def flash_attn(self) -> bool | str | None:
        """-fa on|off|auto and --no-flash-attn, as LoadParams wants them (None: not given)."""
        from localgen import loadsettings

        return loadsettings.flash_attn_value(self.get("flash_attn"), bool(self.get("no_flash_attn")))

    def load(self, check_buffers: bool = True, **override: Any) -> LoadParams:
        """LoadParams from the load settings (those the command lacks keep their defaults); -ot's buffer types
        checked against this build's devices (`check_buffers`: `fit` plans for devices described instead)."""
        from localgen import loadsettings

        # a value LLAMA_ARG_* gave is named by that variable in its errors, not by a flag the user never typed
        values = loadsettings.load_fields({n: v for n, v in self.values.items() if n in LOAD_KNOBS}, self.env)
        values.update(lora=lora_adapters(self.get("lora"), self.get("lora_scaled")))
        values.update(override)
        try:
            params = LoadParams(**values)  # its own checks name the flag: `--ctx takes ...`
        except UsageError as e:
            raise named_by_env(e, self.env) from None
        # (RPC servers' buffer types exist once they are registered: the load checks those)
        if check_buffers and params.override_tensor and not params.rpc:
            from localgen.native import devices

            devices.check_buffers([b for _, b in params.override_tensor], self.named("override_tensor"))
        return params

    def sampling(self, *layers: Mapping[str, Any], grammar: str | None = None) -> SamplingParams:
        """The sampling flags where given; otherwise the last layer that sets a knob (catalogue defaults, then a
        chat's saved /set values); otherwise the default. Everything goes through settings.validate."""
        return self.sampling_flags().params(*layers, grammar=grammar)

    def sampling_flags(self) -> SamplingFlags:
        """The sampling flags the user gave (checked by the one validation), to lay over other values."""
        from localgen import settings

        given: dict[str, Any] = {}
        for key, v in self.values.items():
            if key not in KNOBS or not self.given(key):
                continue
            if key == "dry_sequence_breaker" and [x.lower() for x in v] == ["none"]:
                v = ()
            if KNOBS[key].kind == settings.TEXTS and any(x == "" for x in v or ()):  # it would match nothing
                from localgen.errors import UsageError

                raise UsageError(f"{KNOBS[key].cli[0]} is empty: give the text, or leave the flag out")
            given[key] = settings.check(key, v, KNOBS[key].cli[0])  # a message names the flag typed, not the field
        return SamplingFlags(tuple(given.items()))

    def remote_conflicts(self) -> list[str]:
        """The load settings typed, which a remote endpoint cannot honour (the model loads on the server); the
        context is not among them (it trims the history here), nor a value from the environment (llama.cpp's
        LLAMA_ARG_* variables, exported for local loads, are no request to the server)."""
        return [_typed_as(LOAD_KNOBS[n].flags[0], self.values[n]) for n in self.values
                if n in LOAD_KNOBS and n != "ctx" and self.typed(n) and _set(self.values[n])]


def named_by_env(e: UsageError, env: Mapping[str, str]) -> UsageError:
    """An error of LoadParams' own checks, which begins with a setting's flag (`--ctx takes ...`), where the value
    came from an environment variable (`env`: setting → variable, as Knobs.env): that variable named instead, as the
    user typed no flag (LOCALGEN_CTX=10 is no --ctx 10). Any other error as it is."""
    for name, var in env.items():
        flag = LOAD_KNOBS[name].flags[0].split("/")[0]
        if e.message.startswith((f"{flag} ", f"{flag}:")):
            return UsageError(var + e.message[len(flag):], hint=e.hint)
    return e


def _typed_as(flag: str, value: Any) -> str:
    """A switch's flag as its value says it was typed: `--no-repack` for False of `--repack/--no-repack`."""
    on, _, off = flag.partition("/")
    return off if value is False and off.startswith("--no-") else on


def _set(value: Any) -> bool:
    """Whether a typed load setting asks for something: not None or an empty list. 0 and False do (`-ngl 0`, equal to
    False, and `--no-repack` were dropped unsaid with --endpoint)."""
    return value is not None and not (isinstance(value, (list, tuple)) and not value)


@dataclass(frozen=True)
class SamplingFlags:
    """The sampling flags a user gave on the command line (or in the environment), checked: they win over a
    model's recommended values and a chat's saved /set values, which win over the defaults."""

    given: tuple[tuple[str, Any], ...] = ()  # (the table's name, the typed value)

    def params(self, *layers: Mapping[str, Any], grammar: str | None = None) -> SamplingParams:
        """SamplingParams: the defaults, then each layer in turn, then the flags given."""
        from localgen import settings

        values: dict[str, Any] = {}
        for layer in layers:
            values.update(settings.validate(layer))
        values.update(self.given)
        return SamplingParams(**values, grammar=grammar, asked=frozenset(values))

    @property
    def alone(self) -> SamplingParams:
        """The flags over the defaults (before a model's values are known)."""
        return self.params()


def lora_adapters(plain: str | None, scaled: str | None) -> tuple[tuple[str, float], ...]:
    """--lora FILE,... and --lora-scaled FILE:SCALE,... (llama.cpp's spellings) as (absolute path, scale)
    pairs; a file that is not there is an error before anything loads."""
    from localgen.cli.inputfile import check_input
    from localgen.errors import UsageError

    pairs: list[tuple[str, float, str]] = [(x, 1.0, "--lora") for x in _items(plain)]
    for item in _items(scaled):
        path, sep, text = item.rpartition(":")
        try:
            scale = float(text)
        except ValueError:
            scale = float("nan")
        if not sep or not path or scale != scale or abs(scale) > 1e6:
            raise UsageError(f"--lora-scaled takes FILE:SCALE (e.g. style.gguf:0.5), not {item!r}")
        pairs.append((path, scale, "--lora-scaled"))
    out = []
    for path, scale, flag in pairs:
        check_input(flag, path)
        out.append((str(Path(path).expanduser().resolve()), scale))
    return tuple(out)


def _items(text: str | None) -> list[str]:
    return [x.strip() for x in str(text or "").split(",") if x.strip()]


def typed_by_user(ctx: typer.Context, name: str) -> bool:
    """Whether the user typed a parameter on the command line (not an environment variable or a default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def given_by_user(ctx: typer.Context, name: str) -> bool:
    """Whether the user set a parameter (command line, env var, default map), as opposed to its default."""
    source = ctx.get_parameter_source(name)  # None: no such parameter
    return source is not None and source.name != "DEFAULT"  # command line, env var, default map, prompt
