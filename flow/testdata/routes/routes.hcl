# Every route that a stage or sink has besides its output, for the tests of graphs and of the live
# page: a dedupe's duplicates, an aggregate's late events, and dead letters into a topic, from a
# stage and from a sink; each of those topics is then read by a sink.

pipeline "routes" {}

topic "clicks" {
  partitions = 1
}

topic "per_minute" {
  partitions = 1
}

topic "late_clicks" {
  partitions = 1
  max_lag    = 100
}

topic "duplicate_clicks" {
  partitions = 1
}

topic "failed" {
  partitions = 1
}

stage "once" {
  kind        = "dedupe"
  input       = topic.clicks
  key         = msg.click_id
  within      = "1h"
  duplicates  = topic.duplicate_clicks
  dead_letter = topic.failed
}

stage "per_minute" {
  kind       = "aggregate"
  input      = stage.once
  output     = topic.per_minute
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = topic.late_clicks
  aggregate = { clicks = count() }
}

sink "counts" {
  kind        = "stdout"
  input       = topic.per_minute
  dead_letter = topic.failed
}

sink "late" {
  kind  = "stdout"
  input = topic.late_clicks
}

sink "duplicates" {
  kind  = "stdout"
  input = topic.duplicate_clicks
}

sink "failures" {
  kind  = "stdout"
  input = topic.failed
}
