"""Generated v1beta1 device plugin stubs; regenerate with ``python -m services.deviceplugin.protogen``."""
