"""GPU-hour budgets in the admin configuration: accounts' and users' ``gpu_hours`` and
``gpu_hours_period``, their bounds, and one clear error naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.adminconfig import load_admin_config
from gpusched.errors import ConfigError

ACCOUNTS = """
[[account]]
name = "physics"
gpu_hours = 5000
gpu_hours_period = "quarter"

[[account]]
name = "theory"
parent = "physics"
"""


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "accounts.toml"
    path.write_text(text)
    return load_admin_config([path])


def test_account_and_user_budgets_are_read(tmp_path: Path) -> None:
    config = load(tmp_path, ACCOUNTS + """
[[user]]
name = "alice"
accounts = ["physics", "theory"]
gpu_hours = 12.5
gpu_hours_period = "MONTH"

[[user]]
name = "bob"
accounts = ["physics", "theory"]
gpu_hours = { theory = 40 }
""")
    physics, theory = config.accounts
    assert (physics.gpu_hours, physics.gpu_hours_period) == (5000.0, "quarter")
    assert (theory.gpu_hours, theory.gpu_hours_period) == (None, "none")
    alice, bob = config.users
    assert (alice.gpu_hours, alice.gpu_hours_period) == (
        (("physics", 12.5), ("theory", 12.5)), "month")
    assert (bob.gpu_hours, bob.gpu_hours_period) == ((("theory", 40.0),), "none")


@pytest.mark.parametrize(("entry", "message"), [
    ('gpu_hours = -1', "account[0].gpu_hours: expected a number of GPU-hours from 0 to "
                       "1000000000, got -1"),
    ('gpu_hours = 1e10', "account[0].gpu_hours: expected a number of GPU-hours"),
    ('gpu_hours = nan', "account[0].gpu_hours: expected a number of GPU-hours"),
    ('gpu_hours = true', "account[0].gpu_hours: expected a number of GPU-hours"),
    ('gpu_hours = "100"', "account[0].gpu_hours: expected a number of GPU-hours"),
    ('gpu_hours = 10\ngpu_hours_period = "week"',
     "account[0].gpu_hours_period: expected one of \"none\", \"month\", \"quarter\", \"year\""),
    ('gpu_hours_period = "month"',
     "account[0].gpu_hours_period: expected it left out without gpu_hours"),
])
def test_a_bad_account_budget_is_one_clear_error(tmp_path: Path, entry: str,
                                                  message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f'[[account]]\nname = "physics"\n{entry}\n')
    assert str(caught.value).startswith(f"{tmp_path / 'accounts.toml'}: {message}")


@pytest.mark.parametrize(("entry", "message"), [
    ('gpu_hours = { chemistry = 5 }',
     "user[0].gpu_hours: expected a table of the user's accounts ['physics', 'theory'], "
     "not 'chemistry'"),
    ('gpu_hours = { theory = -5 }', "user[0].gpu_hours: expected a number of GPU-hours"),
    ('gpu_hours = [5]', "user[0].gpu_hours: expected a number of GPU-hours"),
])
def test_a_bad_user_budget_is_one_clear_error(tmp_path: Path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, ACCOUNTS + f'[[user]]\nname = "alice"\naccounts = ["physics", '
                                  f'"theory"]\n{entry}\n')
    assert message in str(caught.value)
