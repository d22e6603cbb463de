// The charts widget's entry (joined after charts.js): the sweep dashboard's and compare()'s charts, alone.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "nbtrain-charts";
  el.appendChild(root);
  const charts = mountCharts(model, root);
  const onMessage = (msg, buffers) => charts.receive(msg, buffers);
  model.on("msg:custom", onMessage);
  model.send({ kind: "hello" });  // a view that opens late: the kernel sends it every trace whole
  return () => {
    model.off("msg:custom", onMessage);
    charts.dispose();
  };
}

export default { render };
