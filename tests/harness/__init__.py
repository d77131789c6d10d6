"""Test harness: real servers and fakes the tests share."""
