"""Log MST's attention / mask / reconstruction picture during pretraining."""
from typing import Optional

from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS
from mmpretrain.utils import get_ori_model

from ...visualization import mst_picture_row, render_rows


@HOOKS.register_module()
class MSTVisualizationHook(Hook):
    """Every ``interval`` iterations, send ``tools/analysis/visualize_mst.py``'s picture of the
    first ``num_images`` global crops to the visualizer backends."""
    priority = 'LOW'

    def __init__(self, interval: int = 500, num_images: int = 2) -> None:
        self.interval, self.num_images = interval, num_images

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs=None) -> None:
        if data_batch is None or not self.every_n_train_iters(runner, self.interval):
            return
        model = get_ori_model(runner.model)
        crops = model.data_preprocessor(data_batch, False)['inputs'][0]
        rows = [mst_picture_row(model, crop) for crop in crops[:self.num_images]]
        runner.visualizer.add_image('mst_pictures', render_rows(rows), step=runner.iter + 1)
