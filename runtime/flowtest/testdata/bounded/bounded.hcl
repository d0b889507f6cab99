# A dedupe and an aggregate stage that hold at most two keys per partition (max_keys), for the tests
# of memory bounds under flowrun test.
pipeline "bounded" {
  key_prefix = "bounded"
}

topic "orders" {
  partitions = 1
  key        = msg.id
}

topic "clicks" {
  partitions = 1
  key        = msg.user
}

stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "10m"
  event_time = msg.at
  max_keys   = 2
}

stage "per_minute" {
  kind       = "aggregate"
  group_by   = msg.user
  input      = topic.clicks
  event_time = msg.at
  max_keys   = 2
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { clicks = count() }
}

sink "orders" {
  kind  = "stdout"
  input = stage.once
}

sink "clicks" {
  kind  = "stdout"
  input = stage.per_minute
}
