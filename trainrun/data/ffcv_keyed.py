"""FFCV augmentations whose random draws depend only on (seed, epoch, sample).

FFCV's random crop, flip and translation draw from numba's per-thread generators, which are
seeded from the operating system and shared by whichever samples a thread happens to process:
two runs of one config train on different augmentations. The operations here seed the drawing
thread's generator from (seed, epoch, sample index, operation) right before each sample's draws,
so a sample is augmented the same way whatever the thread, the batch or the number of ranks.

Written by hand because FFCV has no seeded augmentation. FFCV compiles its pipeline once, and
numba freezes any array a compiled function captures, so the epoch, which changes, is read at
run time from the fixed address of :class:`SampleKeys`'s array (:func:`_load_int64`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cached_property

import numpy as np
from ffcv.fields.rgb_image import IMAGE_MODES, RandomResizedCropRGBImageDecoder
from ffcv.libffcv import imdecode, resize_crop
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.compiler import Compiler
from ffcv.pipeline.operation import Operation
from ffcv.pipeline.state import State
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

CROP, FLIP, TRANSLATE = 1, 2, 3  # one stream per operation


@intrinsic
def _load_int64(typingctx, address):
    """The int64 stored at ``address``, read when the compiled code runs."""

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(types.intp), codegen


def _splitmix(value):
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


class SampleKeys:
    """The run's seed and the current epoch, which every keyed operation reads."""

    def __init__(self, seed: int) -> None:
        self.values = np.array([seed, 0], dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        self.values[1] = epoch

    @cached_property
    def seeder(self) -> Callable[[int, int], None]:
        """A compiled ``seed(sample, stream)`` that seeds the calling thread's generator (compiled
        once, shared by every keyed operation)."""
        address = self.values.ctypes.data
        splitmix = Compiler.compile(_splitmix)

        def seed(sample, stream):
            key = splitmix(np.uint64(_load_int64(address)) ^ np.uint64(0x9E3779B97F4A7C15))
            key = splitmix(key ^ np.uint64(_load_int64(address + 8)))
            key = splitmix(key ^ np.uint64(sample))
            key = splitmix(key ^ np.uint64(stream))
            np.random.seed(np.uint32(key & np.uint64(0xFFFFFFFF)))

        return Compiler.compile(seed)


class KeyedRandomResizedCrop(RandomResizedCropRGBImageDecoder):
    """FFCV's random-resized-crop decoder with each sample's crop drawn from its own key."""

    def __init__(self, keys: SampleKeys, output_size, scale, ratio) -> None:
        super().__init__(output_size, scale=scale, ratio=ratio)
        self.keys = keys

    def generate_code(self) -> Callable:
        jpg, read = IMAGE_MODES["jpg"], self.memory_read
        loop = Compiler.get_iterator()
        decode_jpeg, crop_and_resize = Compiler.compile(imdecode), Compiler.compile(resize_crop)
        draw_crop, seed = Compiler.compile(self.get_crop_generator), self.keys.seeder
        scale, ratio = np.array(self.scale), np.array(self.ratio)

        def decode(batch_indices, my_storage, metadata, storage_state):
            destination, scratch = my_storage
            for slot in loop(len(batch_indices)):
                sample = batch_indices[slot]
                entry = metadata[sample]
                data = read(entry["data_ptr"], storage_state)
                height, width = np.uint32(entry["height"]), np.uint32(entry["width"])
                if entry["mode"] == jpg:
                    pixels = scratch[slot]
                    decode_jpeg(data, pixels, height, width, height, width, 0, 0, 1, 1, False, False)
                    image = pixels.reshape(-1)[: 3 * height * width].reshape(height, width, 3)
                else:
                    image = data.reshape(height, width, 3)
                seed(sample, CROP)
                top, left, crop_height, crop_width = draw_crop(height, width, scale, ratio)
                crop_and_resize(image, top, top + crop_height, left, left + crop_width, destination[slot])
            return destination[: len(batch_indices)]

        decode.is_parallel = True
        return decode


class KeyedHorizontalFlip(Operation):
    """Flip each image left-right with probability 1/2, drawn from the sample's key."""

    def __init__(self, keys: SampleKeys) -> None:
        super().__init__()
        self.keys = keys

    def generate_code(self) -> Callable:
        loop, seed = Compiler.get_iterator(), self.keys.seeder

        def flip(images, dst, indices):
            for slot in loop(images.shape[0]):
                seed(indices[slot], FLIP)
                if np.random.rand() < 0.5:
                    dst[slot] = images[slot, :, ::-1]
                else:
                    dst[slot] = images[slot]
            return dst

        flip.is_parallel = True
        flip.with_indices = True
        return flip

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, AllocationQuery]:
        return replace(previous_state, jit_mode=True), AllocationQuery(previous_state.shape, previous_state.dtype)


class KeyedTranslate(Operation):
    """Shift each image by up to ``padding`` pixels each way (zeros fill), drawn from the sample's key."""

    def __init__(self, keys: SampleKeys, padding: int) -> None:
        super().__init__()
        self.keys, self.padding = keys, padding

    def generate_code(self) -> Callable:
        loop, seed, pad = Compiler.get_iterator(), self.keys.seeder, self.padding

        def translate(images, padded, indices):
            count, height, width, _ = images.shape
            for slot in loop(count):
                seed(indices[slot], TRANSLATE)
                top, left = np.random.randint(0, 2 * pad + 1), np.random.randint(0, 2 * pad + 1)
                padded[slot] = 0
                padded[slot, pad : pad + height, pad : pad + width] = images[slot]
                images[slot] = padded[slot, top : top + height, left : left + width]
            return images

        translate.is_parallel = True
        translate.with_indices = True
        return translate

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, AllocationQuery]:
        height, width, channels = previous_state.shape
        padded = (height + 2 * self.padding, width + 2 * self.padding, channels)
        return replace(previous_state, jit_mode=True), AllocationQuery(padded, previous_state.dtype)
