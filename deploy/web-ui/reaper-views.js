// reaper's columns and saved views for the Temporal Web UI 2.54 (docs/operator-guide.md,
// "The Web UI"), so that the workflows list shows each worker's state without a click.
//
// Paste it into the browser's console on any page of the Web UI (F12, Console, Enter), or
// keep it as a bookmarklet ("javascript:" followed by this file), then reload the page. It
// writes the two settings the Web UI keeps in this browser's local storage, for the
// namespace in the address bar ("default" elsewhere):
// - the workflows list's columns: ReaperWorker, ReaperState, ReaperMissing, Workflow ID,
//   Type, Start (the Status column goes: its RUNNING badge is the workflow's, not the
//   worker's state);
// - saved views "reaper: workers", "reaper: unhealthy", "reaper: lost", "reaper: stalled",
//   "reaper: draining", "reaper: missing handles" (list queries on the Reaper* search
//   attributes), before the views you saved yourself, which are kept.
// Other namespaces' settings are kept. Nothing leaves the browser. The two keys are the
// Web UI's own (not a public interface): tests/e2e/test_web_ui.py checks them on 2.54.
(() => {
  const ns = (location.pathname.match(/\/namespaces\/([^/]+)/) || [null, "default"])[1];
  const read = (key) => {
    try {
      return JSON.parse(localStorage.getItem(key) || "{}") || {};
    } catch (e) {
      return {};
    }
  };
  const columns = read("namespace-workflow-table-columns");
  columns[ns] = ["ReaperWorker", "ReaperState", "ReaperMissing", "Workflow ID", "Type", "Start"]
    .map((label) => ({ label }));
  localStorage.setItem("namespace-workflow-table-columns", JSON.stringify(columns));
  const views = read("saved-workflow-queries");
  const theirs = (views[ns] || []).filter((v) => !String(v.name).startsWith("reaper: "));
  const live = 'WorkflowType="WorkerLiveness" AND ExecutionStatus="Running"';
  const reaper = [
    ["reaper: workers", live],
    ["reaper: unhealthy", 'ReaperState IN ("stalled", "lost")'],
    ["reaper: lost", 'ReaperState="lost"'],
    ["reaper: stalled", 'ReaperState="stalled"'],
    ["reaper: draining", 'ReaperState="draining"'],
    ["reaper: missing handles", "ReaperMissing > 0"],
  ].map(([name, query], i) => ({ id: `reaper-${i}`, name, query, type: "user" }));
  views[ns] = [...reaper, ...theirs];
  localStorage.setItem("saved-workflow-queries", JSON.stringify(views));
  return `reaper's columns and ${reaper.length} saved views set for namespace ${ns}: reload`;
})();
