"""Model classes for SGLang's registry (``SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ext.testbed.sglang_models``).

SGLang imports every module of this package in each of its processes and registers the
classes listed in their ``EntryClass``.  Importing this package itself imports nothing.
"""
