"""One module per softmax method; each calls :func:`kernels.registry.register` when imported.

Adding a method: drop a module here and a matching ``conf/accel/<name>.yaml``. Nothing else changes.
"""
