import enum


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def _stand_in(*args, **kwargs):
    raise RuntimeError("torchvision is a stand-in in this test environment")


decode_jpeg = decode_image = read_image = _stand_in
