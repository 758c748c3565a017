"""Flags generated from config dataclasses parse each supported field type with real argparse."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from replaygpu.agents.config_fields import option
from replaygpu.agents.configs import add_config_flags, config_from_args


@dataclass(frozen=True)
class OptionalConfig:
    max_grad_norm: float | None = option(None, "clip norm")
    eval_every: int | None = 1000
    run_name: Optional[str] = None  # noqa: UP045 - the typing spelling must work too


@dataclass(frozen=True)
class LiteralConfig:
    loss: Literal["huber", "mse"] = option("huber", "TD loss")
    n_step: Literal[1, 3, 5] = 1
    device: Literal["cpu", "gpu"] | None = None


@dataclass(frozen=True)
class PlainConfig:
    steps: int = 100
    learning_rate: float = 1e-3
    env_id: str = "CartPole-v1"
    double_q: bool = True
    hidden_sizes: tuple[int, ...] = (256, 256)


def parser_for(config_cls: type, defaults=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prog")
    add_config_flags(parser, config_cls, defaults)
    return parser


def parse_error(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_optional_float_flag_parses_value_none_and_default():
    parser = parser_for(OptionalConfig)
    assert parser.parse_args(["--max-grad-norm", "0.5"]).max_grad_norm == 0.5
    assert parser.parse_args(["--max-grad-norm", "none"]).max_grad_norm is None
    assert parser.parse_args(["--max-grad-norm", "None"]).max_grad_norm is None
    assert parser.parse_args([]).max_grad_norm is None


def test_optional_int_and_typing_optional_str_flags_parse_inner_type():
    parser = parser_for(OptionalConfig)
    args = parser.parse_args(["--eval-every", "50", "--run-name", "seed3"])
    assert (args.eval_every, args.run_name) == (50, "seed3")
    args = parser.parse_args(["--eval-every", "NONE", "--run-name", "none"])
    assert (args.eval_every, args.run_name) == (None, None)
    assert parser.parse_args([]).eval_every == 1000


def test_optional_int_flag_rejects_non_integer_naming_flag_and_none(capsys):
    err = parse_error(parser_for(OptionalConfig), ["--eval-every", "often"], capsys)
    assert "--eval-every" in err and "'often'" in err and "none" in err


def test_optional_flag_help_shows_none_default_and_value():
    text = parser_for(OptionalConfig).format_help()
    assert "clip norm (default: none" in text
    assert "(default: 1000" in text


def test_literal_flag_accepts_each_valid_value():
    parser = parser_for(LiteralConfig)
    for value in ("huber", "mse"):
        assert parser.parse_args(["--loss", value]).loss == value
    assert parser.parse_args([]).loss == "huber"


def test_literal_flag_rejects_invalid_value_listing_choices(capsys):
    err = parse_error(parser_for(LiteralConfig), ["--loss", "l1"], capsys)
    assert "--loss" in err and "invalid choice: 'l1'" in err
    assert "huber" in err and "mse" in err


def test_int_literal_flag_converts_to_int_and_rejects_other_ints(capsys):
    parser = parser_for(LiteralConfig)
    assert parser.parse_args(["--n-step", "3"]).n_step == 3
    err = parse_error(parser, ["--n-step", "2"], capsys)
    assert "--n-step" in err and "invalid choice: 2" in err


def test_optional_literal_flag_accepts_value_and_none(capsys):
    parser = parser_for(LiteralConfig)
    assert parser.parse_args(["--device", "gpu"]).device == "gpu"
    assert parser.parse_args(["--device", "none"]).device is None
    assert parser.parse_args([]).device is None
    err = parse_error(parser, ["--device", "tpu"], capsys)
    assert "--device" in err and "invalid choice: 'tpu'" in err
    assert "None" not in err and "'none'" in err


def test_literal_flag_help_lists_choices():
    text = parser_for(LiteralConfig).format_help()
    assert "{huber,mse}" in text and "{1,3,5}" in text and "{cpu,gpu,none}" in text
    assert "TD loss (default: huber)" in text


def test_bool_flag_keeps_no_prefix_form():
    parser = parser_for(PlainConfig)
    assert parser.parse_args([]).double_q is True
    assert parser.parse_args(["--no-double-q"]).double_q is False
    assert parser.parse_args(["--double-q"]).double_q is True


def test_int_tuple_flag_parses_comma_separated_and_shows_default():
    parser = parser_for(PlainConfig)
    assert parser.parse_args(["--hidden-sizes", "64,32"]).hidden_sizes == (64, 32)
    assert "(default: 256,256)" in parser.format_help()


@dataclass(frozen=True)
class OptionalTupleConfig:
    conv_sizes: tuple[int, ...] | None = None


def test_optional_int_tuple_flag_parses_sizes_or_none(capsys):
    parser = parser_for(OptionalTupleConfig)
    assert parser.parse_args(["--conv-sizes", "32,64"]).conv_sizes == (32, 64)
    assert parser.parse_args(["--conv-sizes", "none"]).conv_sizes is None
    assert "N,N|none" in parser.format_help()
    err = parse_error(parser, ["--conv-sizes", "32,x"], capsys)
    assert "got '32,x', expected comma-separated integers" in err and "or none" in err


def test_defaults_instance_overrides_field_defaults():
    parser = parser_for(PlainConfig, PlainConfig(steps=7, double_q=False))
    args = parser.parse_args([])
    assert (args.steps, args.double_q) == (7, False)


def test_config_from_args_round_trips_into_the_dataclass():
    parser = parser_for(LiteralConfig)
    argv = ["--loss", "mse", "--n-step", "5", "--device", "cpu"]
    config = config_from_args(LiteralConfig, parser.parse_args(argv))
    assert config == LiteralConfig(loss="mse", n_step=5, device="cpu")

    parser = parser_for(OptionalConfig)
    argv = ["--max-grad-norm", "10", "--eval-every", "none"]
    config = config_from_args(OptionalConfig, parser.parse_args(argv))
    assert config == OptionalConfig(max_grad_norm=10.0, eval_every=None, run_name=None)

    parser = parser_for(PlainConfig)
    config = config_from_args(PlainConfig, parser.parse_args(["--learning-rate", "0.01"]))
    assert config == PlainConfig(learning_rate=0.01)


@dataclass(frozen=True)
class MappingConfig:
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class UnionConfig:
    width: int | str = 3


@dataclass(frozen=True)
class OptionalBoolConfig:
    verbose: bool | None = None


@dataclass(frozen=True)
class FloatTupleConfig:
    scales: tuple[float, ...] = (1.0,)


@pytest.mark.parametrize(
    ("config_cls", "message"),
    [
        (MappingConfig, r"MappingConfig\.sizes.*dict\[str, int\]"),
        (UnionConfig, r"UnionConfig\.width.*int \| str"),
        (OptionalBoolConfig, r"OptionalBoolConfig\.verbose.*bool \| None"),
        (FloatTupleConfig, r"FloatTupleConfig\.scales.*tuple\[float, \.\.\.\]"),
    ],
)
def test_unsupported_annotation_raises_type_error_naming_field_and_type(config_cls, message):
    with pytest.raises(TypeError, match=message):
        add_config_flags(argparse.ArgumentParser(), config_cls)
