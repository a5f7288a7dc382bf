"""Make the fake-NVML fixtures available to the tests in this directory."""

from tests.nvml_fixture import fake_nvml, fake_nvml_factory, fake_nvml_lib  # noqa: F401
