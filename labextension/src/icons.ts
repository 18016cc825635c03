import { LabIcon } from '@jupyterlab/ui-components';

import nvdashSvg from '../style/icons/nvdash.svg';

/** The GPU-chip icon of the sidebar tab and the dashboard panes. */
export const nvdashIcon = new LabIcon({ name: 'nvdash:gpu', svgstr: nvdashSvg });
