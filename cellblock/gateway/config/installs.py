"""`install:` of a local server: the package Cellblock installs for it, and what its install may
reach (`hosts`) or run (`scripts`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from cellblock.policy.hosts import parse_rule
from cellblock.sandbox.installer import Package, PackageError, parse_package

__all__ = ["HostRules", "InstallConfig", "host_rules"]


def host_rules(value: list[str]) -> list[str]:
    """`value`, each entry a valid host rule (`allow_hosts`, `install.hosts`).

    Raises:
        ValueError: an entry that is not one, named with the fix.
    """
    for entry in value:
        parse_rule(entry)
    return value


# A list of `allow_hosts`-style entries, each checked (`allow_hosts`, `install.hosts`).
HostRules = Annotated[list[Annotated[str, Field(min_length=1)]], AfterValidator(host_rules)]


class InstallConfig(BaseModel):
    """A package Cellblock installs for the server (`cellblock install`) and runs read-only:
    exactly one of `npm` (`name@1.2.3`) or `pypi` (`name==1.2.3`); a bare name is pinned to the
    newest release when installed, in the install's record. `hosts`: what its install may reach
    besides the registry (an install script's downloads), through the same egress proxy as a
    server's allowlist; `env`: variables the install is given (where a script downloads from, as
    puppeteer's download base URL says), which cannot replace what the installer sets itself;
    `scripts: false` runs no package code at install (npm: no lifecycle scripts; PyPI: wheels
    only, so no build runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    npm: str | None = None
    pypi: str | None = None
    hosts: HostRules = []
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    scripts: bool = True

    @model_validator(mode="after")
    def _one_valid_package(self) -> InstallConfig:
        given = [(kind, spec) for kind, spec in (("npm", self.npm), ("pypi", self.pypi)) if spec is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of npm: or pypi:")
        try:
            parse_package(*given[0])
        except PackageError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def package(self) -> Package:
        kind, spec = ("npm", self.npm) if self.npm is not None else ("pypi", self.pypi or "")
        return parse_package(kind, spec)
