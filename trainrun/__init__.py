"""trainrun: fast, measured image-classifier training driven by YAML."""

import logging

__version__ = "0.1.0"

# torchao, which transformers and MONAI import, registers its enums with torch's pytree; torch 2.14
# answers each with a deprecation notice on standard error, two lines before every segmentation or
# published-weights command's own output that a user cannot act on (and that scripts reading a
# refusal's one line would have to skip). Only that notice is dropped.
logging.getLogger("torch.utils._pytree").addFilter(
    lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage()
)
