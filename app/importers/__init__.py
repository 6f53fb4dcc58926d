"""Importers: ONNX files and Hugging Face ``config.json`` -> the architecture graph format.

:mod:`app.importers.hf_config` needs only the standard library and :mod:`app.domain`;
:mod:`app.importers.onnx_model` needs the ``onnx`` package. Both return an
:class:`~app.importers.result.ImportedGraph` or raise :class:`~app.importers.result.ImportRejected`.
"""
