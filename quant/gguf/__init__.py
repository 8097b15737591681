"""The GGUF file: the memory-mapped reader (`read`, with the bounds-checked parser `parse`), the
writer of new files (`write`), the copy with some tensors' bytes replaced (`transplant`), row patch
files (`patch`) and `untie` of a tied head.

The reader is the package's face: `gguf.open(path) -> GGUFFile`. It imports neither the writer nor
the transplant, so reading a file stays cheap.
"""
from exactedit.quant.gguf.parse import (ARRAY_DTYPES, DEFAULT_ALIGNMENT, GGUF_MAGIC, HEADER_BYTES, KV,
                                        SCALAR_FORMATS, SUPPORTED_VERSIONS, TensorInfo, ggml_layout,
                                        row_bytes_of)
from exactedit.quant.gguf.read import GGUFFile, GGUFValueType, MetadataInfo, file_sha256, open  # noqa: A004

__all__ = ["ARRAY_DTYPES", "DEFAULT_ALIGNMENT", "GGUF_MAGIC", "GGUFFile", "GGUFValueType", "HEADER_BYTES", "KV",
           "MetadataInfo", "SCALAR_FORMATS", "SUPPORTED_VERSIONS", "TensorInfo", "file_sha256", "ggml_layout",
           "open", "row_bytes_of"]
