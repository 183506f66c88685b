"""What MST sees: attention, masks and reconstruction of one image, as a picture row.

The attention panels follow DINO's ``visualize_attention.py``: the teacher's last-layer CLS
attention over the patches, upsampled to the image (nearest, one block per patch) and laid
over the image. Here the values are shown on one labelled scale per row, in units of a
uniform attention (1 = every patch attended equally), with a colour bar, so heads and images
can be compared; DINO's script rescales every head on its own.
"""
from typing import Dict, List, Optional, Sequence

import mmcv
import numpy as np
import torch

from ..models.utils import attention_mask

# Patch styles, chosen to stay visible when the figure is shrunk to README width: masked
# patches are filled and hatched, candidates get a thick outline in a contrasting colour.
MASKED_FACE = (1.0, 0.0, 0.85, 0.6)
MASKED_HATCH = '////'
CANDIDATE_EDGE = (1.0, 0.85, 0.0, 1.0)


def _to_grid(values: torch.Tensor, grid: tuple) -> np.ndarray:
    return values.reshape(*grid).float().cpu().numpy()


def load_image(path: str, size: int, model) -> torch.Tensor:
    """The RGB image at ``path``, resized to size x size (bicubic), normalised as the
    training preprocessor of ``model`` does: the input of :func:`mst_picture_row`."""
    try:
        img = mmcv.imread(path, channel_order='rgb')
    except Exception as e:  # mmcv raises several types for unreadable files
        raise ValueError(f'Cannot read image {path}: {e}') from e
    if img is None:
        raise ValueError(f'Cannot read image {path}: not an image file.')
    img = mmcv.imresize(img, (size, size), interpolation='bicubic', backend='pillow')
    tensor = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float()
    pre = model.data_preprocessor
    return (tensor - pre.mean.reshape(3, 1, 1)) / pre.std.reshape(3, 1, 1)


@torch.no_grad()
def mst_picture_row(model, image: torch.Tensor,
                    generator: Optional[torch.Generator] = None,
                    label: Optional[str] = None,
                    reconstruct: bool = True) -> Dict[str, np.ndarray]:
    """Everything one row of the picture shows, for a normalised RGB image (3, H, W).

    Args:
        model (MST): A (trained) MST model; its teacher gives the attention.
        image (Tensor): The image, normalised as in training.
        generator (torch.Generator, optional): Random source of the two masks.
        label (str, optional): The row's name (e.g. the class), drawn left of the row.
        reconstruct (bool): Restore the guided-masked image with the student and the
            decoder. False leaves them out: a teacher backbone loaded alone has neither.

    Returns:
        dict: ``image`` (H, W, 3) uint8, ``attn`` (h, w), ``attn_heads`` (heads, h, w),
        ``candidates``, ``guided_mask`` and ``random_mask`` (h, w) bool,
        ``reconstruction`` (H, W, 3) uint8 (absent without a decoder), ``num`` and ``p``
        (the mask settings) and ``label``.
    """
    was_training = model.training
    model.eval()
    batch = image.unsqueeze(0)
    teacher_backbone = model.teacher.module[0]
    feats = teacher_backbone.forward_mst(batch, with_attn=True)
    grid = tuple(feats.feat_map.shape[-2:])
    num, p = model.mask_cfg['num'], model.mask_cfg['p']
    guided = attention_mask(feats.attn, num=num, p=p, mode='attention', generator=generator)
    random = attention_mask(feats.attn, num=num, p=p, mode='random', generator=generator)
    candidates = attention_mask(feats.attn, num=num, p=1.0, mode='attention')
    row = dict(
        image=_denormalise(model, image),
        attn=_to_grid(feats.attn[0], grid),
        attn_heads=feats.attn_heads[0].reshape(-1, *grid).float().cpu().numpy(),
        candidates=_to_grid(candidates[0], grid).astype(bool),
        guided_mask=_to_grid(guided[0], grid).astype(bool),
        random_mask=_to_grid(random[0], grid).astype(bool),
        num=num, p=p, label=label)
    if reconstruct and model.decoder_head is not None:
        student = model.backbone.forward_mst(batch, mask=guided)
        restored = model.decoder_head(student.feat_map)[0]
        row['reconstruction'] = _denormalise(model, restored)
    model.train(was_training)
    return row


def _denormalise(model, image: torch.Tensor) -> np.ndarray:
    preprocessor = model.data_preprocessor
    mean = preprocessor.mean.reshape(3, 1, 1).to(image.device)
    std = preprocessor.std.reshape(3, 1, 1).to(image.device)
    pixels = (image.float() * std + mean).clamp(0, 255)
    return pixels.permute(1, 2, 0).round().byte().cpu().numpy()


def upsample_patches(grid_values: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """Repeat each patch value over its pixels (DINO's nearest upsampling), (h, w) -> size.

    Args:
        grid_values (np.ndarray): One value per patch, (h, w).
        size (Sequence[int]): The image's (H, W); each must be a multiple of h, w.

    Returns:
        np.ndarray: (H, W).
    """
    h, w = grid_values.shape
    if size[0] % h or size[1] % w:
        raise ValueError(f'A {h} x {w} patch grid does not tile a {size[0]} x {size[1]} '
                         'image evenly.')
    return np.kron(grid_values, np.ones((size[0] // h, size[1] // w), grid_values.dtype))


def _grey(image: np.ndarray) -> np.ndarray:
    # ITU-R 601 luma, the weights PIL's convert('L') uses.
    return image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def _draw_patches(ax, grid_mask: np.ndarray, image_size: Sequence[int], **style) -> None:
    from matplotlib.patches import Rectangle
    h, w = grid_mask.shape
    ph, pw = image_size[0] / h, image_size[1] / w
    for i, j in zip(*np.nonzero(grid_mask)):
        # imshow puts pixel centres on integers: the image spans -0.5 .. size - 0.5.
        ax.add_patch(Rectangle((j * pw - 0.5, i * ph - 0.5), pw, ph, **style))


def _draw_mask_panel(ax, row: dict, mask: np.ndarray, candidates: Optional[np.ndarray],
                     linewidth: float) -> None:
    ax.imshow(row['image'], interpolation='nearest')
    size = row['image'].shape[:2]
    if candidates is not None:
        _draw_patches(ax, candidates & ~mask, size, fill=False, edgecolor=CANDIDATE_EDGE,
                      linewidth=linewidth)
    _draw_patches(ax, mask, size, facecolor=MASKED_FACE, edgecolor='white',
                  hatch=MASKED_HATCH, linewidth=linewidth / 2)


def is_grey(image: np.ndarray) -> bool:
    """Whether an (H, W, 3) image has equal R, G and B everywhere."""
    return bool((image == image[..., :1]).all())


def colour_spread(image: np.ndarray) -> float:
    """Mean over pixels of max(R, G, B) - min(R, G, B), 0..255: 0 for a grey image."""
    pixels = image.astype(np.float32)
    return float((pixels.max(-1) - pixels.min(-1)).mean())


def _draw_reconstruction(ax, image: np.ndarray, reconstruction: np.ndarray) -> None:
    """The reconstruction as the decoder gives it; for a grey input, its grey (the mean of
    R, G and B), with the colour the decoder added written under it.

    Why a grey input can come back tinted: the training targets of grey data are exactly
    grey (the colour augmentations keep R = G = B), but the decoder's last conv has three
    independently initialised output filters, and the L1 loss pulls them together only as
    fast as the error shrinks; a short run leaves each channel off by a different amount.
    Drawn as is, that residual reads as a colour the model saw; drawn grey, with its size
    named, the panel shows what was restored and says what was left out.
    """
    if not is_grey(image):
        ax.imshow(reconstruction, interpolation='nearest')
        return
    grey = reconstruction.astype(np.float32).mean(-1)
    ax.imshow(grey, cmap='gray', vmin=0, vmax=255, interpolation='nearest')
    ax.text(0.03, 0.03, f'shown grey\nRGB spread {colour_spread(reconstruction):.0f}/255',
            transform=ax.transAxes, fontsize=6, color='white', va='bottom',
            bbox=dict(facecolor='black', alpha=0.6, pad=1.5, linewidth=0))


def render_rows(rows: List[Dict[str, np.ndarray]], max_heads: int = 6,
                labels: Optional[Sequence[Optional[str]]] = None,
                panel_inches: float = 1.5, dpi: int = 110) -> np.ndarray:
    """Draw rows one under another into an RGB uint8 array (matplotlib, no display needed).

    See :func:`draw_rows` for the columns and arguments.

    Returns:
        np.ndarray: (height, width, 3) uint8.
    """
    fig = draw_rows(rows, max_heads=max_heads, labels=labels, panel_inches=panel_inches,
                    dpi=dpi)
    import matplotlib.pyplot as plt
    fig.canvas.draw()
    picture = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return picture


def column_titles(rows: List[Dict[str, np.ndarray]], max_heads: int = 6) -> List[str]:
    """The titles of the picture columns :func:`draw_rows` draws (its colour bar aside)."""
    heads = min(max_heads, rows[0]['attn_heads'].shape[0])
    num, p = rows[0].get('num'), rows[0].get('p')
    rule = f' (num={num}, p={p})' if num is not None else ''
    titles = (['input', 'attention, mean\nof heads'] + [f'head {h}' for h in range(heads)]
              + ['attention-guided\nmask' + rule, 'random mask\n(same p)'])
    if any('reconstruction' in row for row in rows):
        titles.append('reconstruction\n(guided mask)')
    return titles


def draw_rows(rows: List[Dict[str, np.ndarray]], max_heads: int = 6,
              labels: Optional[Sequence[Optional[str]]] = None,
              panel_inches: float = 1.5, dpi: int = 110, fig=None):
    """The matplotlib figure of :func:`render_rows`, one row per image.

    Columns: the input; the mean and per-head attention laid over the grey image, on one
    scale per row (attention / uniform, from the row's least to its most attended patch)
    with its colour bar; the attention-guided mask
    (candidates outlined, masked patches filled and hatched) and a random mask at the same
    ``p``; the reconstruction from the guided-masked image (for a grey input, its grey, with
    the colour spread the decoder added written under it). A legend names the patch styles.

    Args:
        rows (list[dict]): :func:`mst_picture_row` results.
        max_heads (int): Heads drawn at most. Defaults to 6.
        labels (Sequence[str | None], optional): A name per row (e.g. its class), drawn
            left of the row; defaults to each row's ``label``.
        panel_inches (float): Width of one panel. Defaults to 1.5.
        dpi (int): Resolution. Defaults to 110.
        fig (matplotlib.figure.Figure | SubFigure, optional): Draw into it (e.g. a part
            of a larger figure, sized by the caller) instead of into a new figure.

    Returns:
        matplotlib.figure.Figure: ``fig`` or the new figure; close it with ``plt.close``.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    labels = list(labels) if labels is not None else [row.get('label') for row in rows]
    if len(labels) != len(rows):
        raise ValueError(f'{len(labels)} labels for {len(rows)} rows.')
    heads = min(max_heads, rows[0]['attn_heads'].shape[0])
    titles = column_titles(rows, max_heads)
    attn_columns = range(1, 2 + heads)
    width_ratios = [1] * len(titles) + [0.07]
    if fig is None:
        fig = plt.figure(dpi=dpi, figsize=(panel_inches * (len(titles) + 0.5),
                                           panel_inches * len(rows) + 0.9))
    axes = fig.subplots(len(rows), len(titles) + 1, squeeze=False, gridspec_kw=dict(
        width_ratios=width_ratios, wspace=0.06, hspace=0.12))
    linewidth = max(1.5, 2.2 * panel_inches)  # points; thick enough to survive shrinking
    for r, row in enumerate(rows):
        image = row['image']
        size = image.shape[:2]
        uniform = 1.0 / row['attn'].size
        maps = [row['attn'], *row['attn_heads'][:heads]]
        # One scale per row, from its least to its most attended patch: a trained teacher's
        # maps can span a narrow band around 1, which a scale from 0 would hide.
        vmin = min(float(m.min()) for m in maps) / uniform
        vmax = max(max(float(m.max()) for m in maps) / uniform, vmin + 1e-6)
        grey = _grey(image)
        axes[r, 0].imshow(image, interpolation='nearest')
        for c, grid_map in zip(attn_columns, maps):
            ax = axes[r, c]
            ax.imshow(grey, cmap='gray', vmin=0, vmax=255, interpolation='nearest')
            heat = ax.imshow(upsample_patches(grid_map / uniform, size), cmap='inferno',
                             vmin=vmin, vmax=vmax, alpha=0.7, interpolation='nearest')
        column = 2 + heads
        _draw_mask_panel(axes[r, column], row, row['guided_mask'], row['candidates'],
                         linewidth)
        _draw_mask_panel(axes[r, column + 1], row, row['random_mask'], None, linewidth)
        if 'reconstruction' in row:
            _draw_reconstruction(axes[r, column + 2], row['image'], row['reconstruction'])
        colorbar = fig.colorbar(heat, cax=axes[r, -1])
        colorbar.ax.tick_params(labelsize=6)
        colorbar.set_label('attention / uniform', fontsize=6)
        for c, ax in enumerate(axes[r, :-1]):
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(titles[c], fontsize=7)
        if labels[r]:
            axes[r, 0].set_ylabel(labels[r], fontsize=8)
    fig.legend(handles=[
        Patch(facecolor=MASKED_FACE, edgecolor='white', hatch=MASKED_HATCH,
              label='masked patch (the student sees [MASK])'),
        Patch(facecolor='none', edgecolor=CANDIDATE_EDGE, linewidth=2,
              label='candidate, not masked: among the 1/num patches the teacher attends '
                    'least'),
    ], loc='lower center', ncol=2, fontsize=7, frameon=False)
    width, height = fig.bbox.width / fig.dpi, fig.bbox.height / fig.dpi  # inches
    fig.subplots_adjust(left=0.04, right=min(0.95, 1 - 0.7 / width), top=1 - 0.45 / height,
                        bottom=0.35 / height)
    for r in range(len(rows)):  # each colour bar as tall as its row's (square) panels
        panel = axes[r, 1]
        panel.apply_aspect()
        bar = axes[r, -1].get_position()
        height = panel.get_position()
        axes[r, -1].set_position([bar.x0, height.y0, bar.width, height.height])
    return fig
