"""The rank's Ray actor, the top of each rank's process: ``TrainWorker`` joins the process group, puts in
place what the run's code needs (the Ray Train seam, the patches for the user's own code) and runs the
function through the session and the API below it, which never import it back.

Runs in each rank's process; the supervisor and the warm pool import it only to create the actors.
"""
