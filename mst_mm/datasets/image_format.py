"""What an image file really holds (format, completeness, why it is unusable), judged from
its bytes: scraped data has JPEGs named ``.png``, empty files and saved HTML error pages."""
import os.path as osp
import struct
from typing import Optional

# (format, test on the first bytes); the first match wins.
_SIGNATURES = (
    ('JPEG', lambda b: b[:3] == b'\xff\xd8\xff'),
    ('PNG', lambda b: b[:8] == b'\x89PNG\r\n\x1a\n'),
    ('GIF', lambda b: b[:6] in (b'GIF87a', b'GIF89a')),
    # 'BM' alone also starts text; the DIB header's own size (one of a few) confirms it
    ('BMP', lambda b: b[:2] == b'BM' and len(b) >= 18
     and struct.unpack('<I', b[14:18])[0] in (12, 16, 40, 52, 56, 64, 108, 124)),
    ('TIFF', lambda b: b[:4] in (b'II*\x00', b'MM\x00*')),
    ('WebP', lambda b: b[:4] == b'RIFF' and b[8:12] == b'WEBP'),
    ('PNM', lambda b: len(b) >= 3 and b[:1] == b'P' and b[1:2] in b'123456'
     and b[2:3] in b' \t\r\n#'),
    ('JPEG 2000', lambda b: b[:12] == b'\x00\x00\x00\x0cjP  \r\n\x87\n'
     or b[:4] == b'\xff\x4f\xff\x51'),
    ('JPEG XL', lambda b: b[:2] == b'\xff\x0a' or b[:12] == b'\x00\x00\x00\x0cJXL \r\n\x87\n'),
    ('HEIC', lambda b: b[4:8] == b'ftyp' and b[8:12] in (b'heic', b'heix', b'mif1', b'msf1')),
    ('AVIF', lambda b: b[4:8] == b'ftyp' and b[8:12] in (b'avif', b'avis')),
    ('OpenEXR', lambda b: b[:4] == b'v/1\x01'),
    ('Radiance HDR', lambda b: b[:10] == b'#?RADIANCE' or b[:6] == b'#?RGBE'),
)

# Formats that OpenCV's pip wheels cannot decode: the reason then says so and how to fix it.
_UNSUPPORTED = {'HEIC', 'AVIF', 'JPEG XL'}

# Other files that turn up in image folders: named, so the reason is concrete.
_NOT_IMAGES = (
    ('PDF document', lambda b: b[:5] == b'%PDF-'),
    ('ZIP archive', lambda b: b[:4] == b'PK\x03\x04'),
    ('gzip archive', lambda b: b[:2] == b'\x1f\x8b'),
    ('MP4/QuickTime video', lambda b: b[4:8] == b'ftyp'),
)

_EXTENSION_FORMATS = {
    '.jpg': 'JPEG', '.jpeg': 'JPEG', '.jpe': 'JPEG', '.jfif': 'JPEG', '.png': 'PNG',
    '.gif': 'GIF', '.bmp': 'BMP', '.dib': 'BMP', '.tif': 'TIFF', '.tiff': 'TIFF',
    '.webp': 'WebP', '.ppm': 'PNM', '.pgm': 'PNM', '.pbm': 'PNM', '.pnm': 'PNM',
    '.jp2': 'JPEG 2000', '.j2k': 'JPEG 2000', '.jxl': 'JPEG XL', '.heic': 'HEIC',
    '.heif': 'HEIC', '.avif': 'AVIF', '.exr': 'OpenEXR', '.hdr': 'Radiance HDR',
}

_JPEG_EOI, _JPEG_SOS = b'\xff\xd9', b'\xff\xda'
_PNG_IEND, _PNG_IDAT = b'IEND', b'IDAT'


def sniff_image_format(data: bytes) -> Optional[str]:
    """The image format (e.g. ``'JPEG'``) that the first 32 bytes announce, or None."""
    head = data[:32]
    return next((name for name, test in _SIGNATURES if test(head)), None)


def format_from_extension(filename: str) -> Optional[str]:
    """The image format that a file name's extension claims, or None if it claims none."""
    return _EXTENSION_FORMATS.get(osp.splitext(filename)[1].lower())


def image_problem(img_bytes: bytes, filename: str = '') -> Optional[str]:
    """Why these bytes cannot be a whole image (e.g. ``'empty file'``), judged before
    decoding, or None ("try the decoder", not "valid"). ``filename`` is unused."""
    # OpenCV decodes a truncated JPEG without an error, so check the end marker first.
    if not img_bytes:
        return 'empty file'
    fmt = sniff_image_format(img_bytes)
    if fmt == 'JPEG' and not _jpeg_is_complete(img_bytes):
        return 'truncated JPEG (no EOI marker)'
    if fmt == 'PNG' and not _png_is_complete(img_bytes):
        return 'truncated PNG (no IEND chunk)'
    if fmt in ('BMP', 'WebP'):
        declared = _declared_size(img_bytes, fmt)
        if declared is not None and len(img_bytes) < declared:
            return f'truncated {fmt} ({len(img_bytes)} of the {declared} bytes its header declares)'
    return None


def undecodable_reason(img_bytes: bytes) -> str:
    """Why the decoder returned nothing for these bytes, e.g. ``'not an image (text)'``."""
    if not img_bytes:
        return 'empty file'
    fmt = sniff_image_format(img_bytes)
    if fmt in _UNSUPPORTED:
        return f'{fmt} image, which OpenCV cannot decode: convert it to JPEG or PNG'
    if fmt is not None:
        return f'corrupt {fmt} (the decoder could not read it)'
    head = img_bytes[:1024]
    for name, test in _NOT_IMAGES:
        if test(head):
            return f'not an image ({name})'
    text = _as_text(head)
    if text is not None:
        start = text.lstrip().lower()
        if start.startswith(('<!doctype html', '<html')):
            return 'not an image (an HTML page, e.g. the error page of a failed download)'
        if '<svg' in start[:512]:
            return 'not an image (SVG, a vector format OpenCV cannot decode: convert it to PNG)'
        return 'not an image (text)'
    return f'not an image (unknown format, starts with {img_bytes[:8].hex(" ")})'


def _jpeg_is_complete(data: bytes) -> bool:
    # EOI after the last scan accepts camera trailers but not an EXIF thumbnail's own EOI.
    tail = data[-64:].rstrip(b'\x00\r\n ')
    return _JPEG_EOI in tail or data.rfind(_JPEG_EOI) > data.rfind(_JPEG_SOS)


def _png_is_complete(data: bytes) -> bool:
    # IEND ends the file, or follows the last image-data chunk (junk appended after IEND).
    tail = data[-64:].rstrip(b'\x00\r\n ')
    return _PNG_IEND in tail or data.rfind(_PNG_IEND) > data.rfind(_PNG_IDAT)


def _declared_size(data: bytes, fmt: str) -> Optional[int]:
    """The total size that a BMP or WebP header declares; None where it declares none."""
    if fmt == 'BMP' and len(data) >= 6:
        size = struct.unpack('<I', data[2:6])[0]
        return size or None   # some writers leave the field 0
    if fmt == 'WebP' and len(data) >= 8:
        return struct.unpack('<I', data[4:8])[0] + 8
    return None


def _as_text(sample: bytes) -> Optional[str]:
    """The sample decoded as UTF-8 text if it reads as text, else None."""
    if b'\x00' in sample:
        return None
    for cut in range(4):   # the sample may end inside a multi-byte character
        try:
            text = sample[:len(sample) - cut].decode('utf-8')
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    printable = sum(c.isprintable() or c in '\t\n\r\f\v' for c in text)
    return text if printable >= 0.95 * max(len(text), 1) else None
