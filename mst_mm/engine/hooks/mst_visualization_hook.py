"""Log MST's attention / mask / reconstruction picture during pretraining."""
from typing import Optional

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class MSTVisualizationHook(Hook):
    """Every ``interval`` iterations, draw the first global crop of the batch and send the
    picture to the runner's visualizer backends (local files, TensorBoard, W&B, ...).

    The row is the one of ``tools/analysis/visualize_mst.py``: input, teacher attention
    (mean and per head), guided and random masks, reconstruction.

    Args:
        interval (int): Iterations between pictures. Defaults to 500.
        num_images (int): Images of the batch to draw. Defaults to 2.
    """
    priority = 'LOW'

    def __init__(self, interval: int = 500, num_images: int = 2) -> None:
        self.interval = interval
        self.num_images = num_images

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs=None) -> None:
        if data_batch is None or not self.every_n_train_iters(runner, self.interval):
            return
        from mst_mm.visualization import mst_picture_row, render_rows

        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        crops = model.data_preprocessor(data_batch, False)['inputs'][0]
        rows = [mst_picture_row(model, crop) for crop in crops[:self.num_images]]
        runner.visualizer.add_image('mst_pictures', render_rows(rows), step=runner.iter + 1)
