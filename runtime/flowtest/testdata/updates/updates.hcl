# A changelog of counts per user and minute (emit = "on_update"), effectively once.
pipeline "updates" {
  delivery = "effectively_once"
}

topic "views" {
  partitions = 1
  key        = msg.user
}

stage "per_minute" {
  kind       = "aggregate"
  group_by   = msg.user
  input      = topic.views
  event_time = msg.at
  emit       = "on_update"
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    views = count()
  }
}

sink "out" {
  kind  = "stdout"
  input = stage.per_minute
}
