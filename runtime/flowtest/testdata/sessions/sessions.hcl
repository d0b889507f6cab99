# Sessions of page views per user, for the tests of session windows under flowrun test: a session
# lasts from a user's first view to 5 minutes after the last, and closes a minute (grace) later.
pipeline "sessions" {
  key_prefix = "sessions"
}

topic "views" {
  partitions = 1
  key        = msg.user
}

topic "late_views" {
  partitions = 1
}

stage "sessions" {
  kind       = "aggregate"
  group_by   = msg.user
  input      = topic.views
  event_time = msg.at
  window {
    type = "session"
    gap  = "5m"
  }
  grace = "1m"
  late  = topic.late_views
  aggregate = {
    views = count()
    pages = count_distinct(msg.page)
    first = first(msg.page)
    last  = last(msg.page)
  }
}

# The same sessions as a changelog: their value after every batch that changed them.
stage "updates" {
  kind       = "aggregate"
  group_by   = msg.user
  input      = topic.views
  event_time = msg.at
  window {
    type = "session"
    gap  = "5m"
  }
  grace     = "1m"
  late      = "drop"
  emit      = "on_update"
  aggregate = { views = count() }
}

sink "out" {
  kind  = "stdout"
  input = stage.sessions
}

sink "changelog" {
  kind  = "stdout"
  input = stage.updates
}

sink "late" {
  kind  = "stdout"
  input = topic.late_views
}
