"""`rollout envs [FAMILY]`: the environments an env worker started here would host.

Built-in environments by name, then each third-party family (`FAMILY:NAME`) with its package
and version, or "not installed" and the extra that installs it. With a family, its names
(where the family can list them: reasoning-gym's generators, Gymnasium's registered ids).
"""

from __future__ import annotations

from rich.table import Table

from rollout_service.cli._console import console


def cmd_envs(args) -> None:
    from env_workers import adapters, registry

    if args.family:
        if args.family not in adapters.FAMILIES:
            raise SystemExit(f"unknown family {args.family!r}; known: {', '.join(sorted(adapters.FAMILIES))}")
        try:
            mod = adapters.adapter(args.family)
        except registry.EnvPackageMissing as e:
            raise SystemExit(str(e)) from None
        names = mod.names()
        if names is None:
            console.print(f"{args.family}: any name its loader finds (see `rollout envs`); it cannot list them")
            return
        table = Table("name", "description")
        for n in names:
            table.add_row(f"{args.family}:{n}", mod.describe(n) if hasattr(mod, "describe") else "")
        console.print(table)
        return
    table = Table("name", "description", "package")
    for n in registry.names():
        table.add_row(n, registry.spec(n).description, "built in")
    have = set(adapters.installed())
    for f, fam in sorted(adapters.FAMILIES.items()):
        v = adapters.version(f)
        pkg = f"{fam.dist} {v}" if f in have and v else ("built in (httpx)" if f in have else
                                                          f"not installed: {fam.dist} (extra envs-thirdparty)")
        table.add_row(f"{f}:NAME", fam.description, pkg)
    console.print(table)
