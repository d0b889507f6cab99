# The watermark of each stateful stage, per partition of its input, as /api/graph, the live page
# and the metric flowrun_watermark_lag_seconds show it (watermark_view_test.go). A dedupe and an
# aggregate read topics that only the test writes, so that each measures its own watermark per
# partition: the latest event time read there.

pipeline "marks" {}
topic "orders" {
  partitions = 2
  key        = msg.id
}
topic "clicks" {
  partitions = 2
  key        = msg.user
}
stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "1h"
  event_time = msg.at
}
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.clicks
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { clicks = count() }
}
stage "shown" {
  kind  = "map"
  input = stage.once
  set   = { shown = true }
}
sink "out" {
  kind  = "stdout"
  input = stage.shown
}
sink "counts" {
  kind  = "stdout"
  input = stage.per_minute
}
