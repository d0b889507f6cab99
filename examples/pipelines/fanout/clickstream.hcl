# A keyed fan-out with routing. Generated click-stream events are keyed by user, so each user's
# events stay in order across every hop, and routed by type: purchases are priced and printed,
# sign-ups are appended to a file, and the remaining activity is counted by page.

pipeline "clickstream" {
  key_prefix = "clickstream"
}

variable "events" {
  type        = number
  default     = 200
  description = "How many events to generate."
}

variable "signups_file" {
  type    = string
  default = "signups.jsonl"
}

variable "vat_rate" {
  type    = number
  default = 0.19
}

locals {
  types = ["view", "view", "click", "view", "purchase", "click", "signup"]
  pages = ["/", "/pricing", "/docs", "/blog"]
}

source "events" {
  kind   = "generate"
  count  = var.events
  output = topic.events
  template = {
    user  = "user-${index % 25}"
    seq   = index
    type  = local.types[index % length(local.types)]
    page  = local.pages[index % length(local.pages)]
    price = (index % 5 + 1) * 10
  }
}

topic "events" {
  partitions = 8
  key        = msg.user
}

topic "purchases" { partitions = 4 }
topic "signups" { partitions = 1 }
topic "activity" { partitions = 8 }

stage "by_type" {
  kind  = "route"
  input = topic.events

  case {
    when   = msg.type == "purchase"
    output = topic.purchases
  }
  case {
    when   = msg.type == "signup"
    output = topic.signups
  }
  default = topic.activity
}

stage "price" {
  kind  = "map"
  input = topic.purchases
  set = {
    net   = msg.price
    gross = floor(msg.price * (1 + var.vat_rate) * 100 + 0.5) / 100
  }
  drop = ["price"]
}

sink "purchases" {
  kind  = "stdout"
  input = stage.price
}

sink "signups" {
  kind  = "file"
  input = topic.signups
  path  = var.signups_file
}

stage "clicks" {
  kind     = "filter"
  input    = topic.activity
  where    = msg.type == "click"
  ordering = "none"
}

sink "click_log" {
  kind  = "stdout"
  input = stage.clicks
}
