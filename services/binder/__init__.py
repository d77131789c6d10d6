"""Binder service: the only Kubernetes client; binds pods and explains Pending ones."""
