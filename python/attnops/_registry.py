"""The registry of attention operators, mirroring attnops::Registry (registry.h)."""

import json
import os

from . import _attnops
from ._operator import Operator


def as_config(config):
    """A Config from None, a YAML file path, a dict (the YAML schema as Python data) or a Config."""
    if config is None or isinstance(config, _attnops.Config):
        return config
    if isinstance(config, (str, os.PathLike)):
        return _attnops.load_config(os.fspath(config))
    if isinstance(config, dict):
        # JSON is YAML: the C++ parser checks keys, types and values as for a file.
        return _attnops.parse_config(json.dumps(config), "<dict>")
    raise TypeError(
        "config: expected a YAML file path, a dict or an attnops.Config, got " + type(config).__name__
    )


class Registry:
    """The process-wide registry (attnops::registry()): vanilla, blocksparse (alias splash),
    flash_attn2 (alias flash).

        op = attnops.registry().get("blocksparse", config="config/default.yaml")
        res = op(q, k, v, causal=True)
    """

    def names(self):
        """Canonical operator names, sorted."""
        return list(_attnops.registry_names())

    def aliases(self, name):
        """The aliases of an operator (by canonical name or alias)."""
        return list(_attnops.registry_entry(name)[1])

    def canonical(self, name):
        """The canonical name of an operator or alias (attnops.UnknownOperator otherwise)."""
        return _attnops.registry_entry(name)[0]

    def defaults(self, name):
        """The operator's own default settings (fallbacks, block sizes), before any config."""
        return _attnops.registry_entry(name)[2]

    def get(self, name=None, config=None):
        """A callable attnops.Operator. name: a canonical name or alias; None takes the config's
        attn_mechanism (as EasyDeL). config: a YAML path, a dict of the same schema, or a Config."""
        cfg = as_config(config)
        if name is None:
            name = cfg.attn_mechanism if cfg is not None else None
            if name is None:
                raise TypeError("registry().get: no operator name and no attn_mechanism in the config")
        return Operator(name, cfg)

    def __contains__(self, name):
        try:
            _attnops.registry_entry(name)
        except KeyError:
            return False
        return True

    def __iter__(self):
        return iter(self.names())

    def __repr__(self):
        return "attnops.Registry(" + ", ".join(self.names()) + ")"


_REGISTRY = Registry()


def registry():
    """The process-wide registry of attention operators."""
    return _REGISTRY
