# Ad views enriched with their campaign, then correlated with the clicks that followed them: a
# table holds each campaign, a lookup adds it to each view, and a left join matches each view with
# the clicks on its ad from the moment of the view to 10 minutes after.
#
#   flowrun run --until-drained examples/pipelines/adclicks --var output=bin/clicked.jsonl
#
# Each view comes out once per click that matched it, and a view that no click matched comes out
# once, with the click's fields null, when no click could match it any more (the watermark is past
# its 10 minutes plus grace; a job emits those still waiting at its end). A click that comes more
# than grace after later clicks is late: it goes to its own file.

pipeline "adclicks" {
  key_prefix  = "adclicks"
  description = "Ad views with their campaign, each with the clicks that followed it."
}

variable "campaigns" {
  type        = string
  default     = null
  description = "The campaigns, as JSON lines; the sample next to this file when not set."
}

variable "views" {
  type        = string
  default     = null
  description = "The ad views, as JSON lines; the sample next to this file when not set."
}

variable "clicks" {
  type        = string
  default     = null
  description = "The clicks, as JSON lines; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "clicked.jsonl"
  description = "Where the views go, with their campaign and clicks, a line each."
}

variable "late_output" {
  type        = string
  default     = "late_clicks.jsonl"
  description = "Where late clicks and views go."
}

locals {
  campaigns = coalesce(var.campaigns, "${path.pipeline}/data/campaigns.jsonl")
  views     = coalesce(var.views, "${path.pipeline}/data/views.jsonl")
  clicks    = coalesce(var.clicks, "${path.pipeline}/data/clicks.jsonl")
}

source "campaigns" {
  kind   = "file"
  path   = local.campaigns
  output = topic.campaigns
}

source "views" {
  kind   = "file"
  path   = local.views
  output = topic.views
}

source "clicks" {
  kind   = "file"
  path   = local.clicks
  output = topic.clicks
}

topic "campaigns" {
  key = msg.campaign_id
}

topic "views" {
  partitions = 2
  key        = msg.view_id
}

topic "clicks" {
  partitions = 2
  key        = msg.click_id
}

topic "late" {}

table "campaigns" {
  input = topic.campaigns
}

# Each view with its campaign's record at msg.campaign.
stage "views_with_campaign" {
  kind  = "lookup"
  input = topic.views
  table = table.campaigns
  key   = msg.campaign_id
  as    = "campaign"
}

# A view and each click on its ad from the view's time to 10 minutes after; a view without one,
# alone. The two sides meet in one partition per ad (clicked_views.by_key).
stage "clicked_views" {
  kind = "join"
  type = "left"
  left {
    input      = stage.views_with_campaign
    key        = msg.ad_id
    event_time = msg.ts
  }
  right {
    input      = topic.clicks
    key        = msg.ad_id
    event_time = msg.ts
  }
  after = "10m"
  grace = "30s"
  late  = topic.late
  select = {
    view_id  = left.view_id
    ad_id    = left.ad_id
    campaign = left.campaign.name
    viewed   = left.ts
    click_id = right.click_id
    clicked  = right.ts
  }
}

sink "clicked" {
  kind  = "file"
  input = stage.clicked_views
  path  = var.output
}

sink "late" {
  kind  = "file"
  input = topic.late
  path  = var.late_output
}
