"""The dashboard: a read-only live web page and JSON API over what Tessera publishes on NATS."""
