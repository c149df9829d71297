"""What this host can run, as data and as text: ``attnops.info()`` returns what
``attnops info --json`` prints; ``python3 -m attnops.info`` prints the table
(``--json``: the JSON; ``--config FILE``; ``--allow-software``).

For every registered operator and backend: its place in the order the dispatcher tries
(gpu, cpu, native unless the config says otherwise), whether the operator implements it
(forward and backward), whether the host has it, and why not.
"""

import argparse
import json
import sys
import types

from . import _attnops
from ._registry import as_config, registry

_BACKENDS = ("gpu", "cpu", "native", "tpu")
_AUTO_ORDER = ("gpu", "cpu", "native")


def _operator_rows(config):
    rows = []
    for name in registry().names():
        op = registry().get(name, config=config)
        md = op.metadata
        order = list(md["backends"]) + [b for b in _AUTO_ORDER if b not in md["backends"]]
        gpu = md["gpu"]
        for b in _BACKENDS:
            position = order.index(b) + 1 if b in order else 0
            implements = op.implements(b)
            available, detail = _attnops.host_availability(
                b, gpu["device"], gpu["allow_software"], gpu["pipeline_cache"]
            )
            disabled = b in md["disabled_backends"]
            tried = position > 0 and implements and available and not disabled
            if position == 0:
                why = (
                    "not in the candidate order (the auto order is gpu, cpu, native; name it with "
                    "--backend or backend:)"
                )
            elif disabled:
                why = "disabled_by_config"
            elif not available:
                why = "backend_unavailable: " + detail
            elif not implements:
                why = "not_implemented: " + name + " has no forward_" + b
            else:
                why = detail
            rows.append(
                {
                    "operator": name,
                    "backend": b,
                    "order": position,
                    "implements": implements,
                    "implements_backward": op.implements_backward(b),
                    "available": available,
                    "disabled": disabled,
                    "tried": tried,
                    "why_not": "" if tried else why,
                    "detail": detail,
                }
            )
    return rows


def collect(config=None, allow_software=False):
    """{"cpu": {...}, "gpu_devices": [...], "operators": [...]} (the keys of `attnops info --json`,
    plus "detail" per operator row and "version")."""
    cfg = as_config(config)
    if allow_software:
        # As the CLI's --allow-software: the top-level gpu setting, whatever the config says.
        cfg = _attnops.config_allowing_software(cfg)
    gpu = registry().get(registry().names()[0], config=cfg).metadata["gpu"]
    return {
        "version": _attnops.__version__,
        "cpu": _attnops.host_cpu(),
        "gpu_settings": gpu,
        "gpu_devices": _attnops.host_gpu_devices(gpu["device"], gpu["allow_software"], gpu["pipeline_cache"]),
        "operators": _operator_rows(cfg),
    }


def _yes(b):
    return "yes" if b else "no"


def format_text(data):
    """The report as `attnops info` prints it."""
    cpu = data["cpu"]
    gpu = data["gpu_settings"]
    lines = [
        "attnops " + data["version"],
        "CPU: {}, {} OpenMP threads".format(cpu["isa"] or "(no SIMD extensions detected)", cpu["threads"]),
        "CPU kernels: ISA tier {} ({})".format(cpu["tier"], cpu["tier_detail"]),
        "Vulkan devices (allow_software={}{}): {}".format(
            _yes(gpu["allow_software"]),
            ", device=" + gpu["device"] if gpu["device"] else "",
            len(data["gpu_devices"]),
        ),
    ]
    for d in data["gpu_devices"]:
        lines.append(
            "  #{index} {name}  type={type}  api={api_version}  shared_mem={max_shared_memory}  "
            "max_invocations={max_workgroup_invocations}  subgroup={subgroup_size}  "
            "storage_range={max_storage_buffer_range}  f16={f16}".format(f16=_yes(d["shader_f16"]), **d)
        )
        lines.append(
            "      qualifies: " + _yes(d["qualifies"]) + ("" if d["qualifies"] else " (" + d["why_not"] + ")")
        )
    lines.append("")
    lines.append("Operators x backends (order = place in the list the dispatcher tries):")
    fmt = "{:<12} {:<7} {:<5} {:<10} {:<8} {:<9} {:<5} {}"
    lines.append(fmt.format("operator", "backend", "order", "implements", "backward", "available", "tried",
                            "why not / detail"))
    for r in data["operators"]:
        lines.append(
            fmt.format(
                r["operator"],
                r["backend"],
                r["order"] or "-",
                _yes(r["implements"]),
                _yes(r["implements_backward"]),
                _yes(r["available"]),
                _yes(r["tried"]),
                r["why_not"] if not r["tried"] else r["detail"],
            )
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m attnops.info", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML configuration (backend order, disabled backends, gpu settings)")
    parser.add_argument("--allow-software", action="store_true", help="let software Vulkan devices qualify")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    data = collect(config=args.config, allow_software=args.allow_software)
    print(json.dumps(data, indent=2) if args.json else format_text(data))
    return 0


class _CallableModule(types.ModuleType):
    """Importing the submodule attnops.info replaces the function attnops.info on the package;
    the module is callable, so attnops.info(...) works either way."""

    def __call__(self, config=None, allow_software=False):
        return collect(config=config, allow_software=allow_software)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
