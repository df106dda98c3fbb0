/*
 * plot.h — private to the train module: a loss-vs-step SVG plot written at the end of a run
 * (and whenever the trainer wants), so a user sees the curve without any Python.
 *
 * Not here: reading metrics files, log scales, or any other chart kind.
 */
#ifndef LOOM_TRAIN_PLOT_H
#define LOOM_TRAIN_PLOT_H

#include "loom/base.h"

#include <stddef.h>
#include <stdint.h>

/* Writes an SVG line plot of training loss (and validation loss points/line if n_val > 0) vs
 * step, with axes, tick labels, legend and title; atomic write. Non-finite values are skipped
 * (a plot with no finite point says so); a single point or a constant series still gets a
 * nonzero axis range. Arrays may be NULL when their count is 0. */
loom_status loom_plot_loss_svg(const char *path, const char *title, const int64_t *steps,
                               const double *loss, size_t n, const int64_t *val_steps,
                               const double *val_loss, size_t n_val);

#endif
