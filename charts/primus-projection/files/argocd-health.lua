-- Argo CD health check of primus.dev/TrainingPlan (argocd-cm key
-- resource.customizations.health.primus.dev_TrainingPlan; docs/gitops.md).
-- Degraded: Stalled=True or phase Failed. Suspended: the job was created suspended for review.
-- Healthy: Ready=True. Progressing: anything else, including a status that describes an older
-- generation than the spec's.
local hs = {}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Primus operator to pick the plan up"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if status.observedGeneration == nil or (generation ~= nil and status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the Primus operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = status.conditions
local stalled = condition(conditions, "Stalled")
local ready = condition(conditions, "Ready")
local reconciling = condition(conditions, "Reconciling")
local job = condition(conditions, "JobCreated")
local drift = condition(conditions, "DriftWithinTolerance")

if isTrue(stalled) or status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = text(stalled, "The plan failed")
  return hs
end

if isTrue(job) and job.reason == "Suspended" then
  hs.status = "Suspended"
  hs.message = text(job, "The PyTorchJob is suspended")
  return hs
end

if isTrue(ready) then
  hs.status = "Healthy"
  hs.message = text(ready, "Ready")
  if drift ~= nil and drift.status == "False" then
    hs.message = hs.message .. "; " .. text(drift, "measured throughput is outside the drift tolerance")
  end
  return hs
end

hs.status = "Progressing"
if isTrue(reconciling) then
  hs.message = text(reconciling, "Reconciling")
else
  hs.message = text(ready, "Waiting for the plan to become Ready")
end
return hs
