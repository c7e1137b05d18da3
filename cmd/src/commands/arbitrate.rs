//! "Who else is connected" before opening a console or VNC stream: show the holder and ask
//! `[y] yes  [N] no  [w] wait until free`, or warn when nobody can answer.

use std::io::{BufRead, Write};
use std::time::Duration;

use kubevm::cluster::Cluster;
use kubevm::session::{self, Answer, Decision};
use kubevm::stream::StreamTarget;

use crate::error::{CommandError, CommandResult};
use crate::prompt;

/// Spinner frames (d8's).
pub const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// Whether to go on connecting (`false`: the user said no).
pub async fn check(
    cluster: &Cluster,
    target: &StreamTarget,
    me: Option<&str>,
    force: bool,
) -> CommandResult<bool> {
    if force {
        return Ok(true);
    }
    let holder = session::holder(cluster, target).await;
    let now = jiff::Timestamp::now();
    let decision = session::decide(
        force,
        holder.as_ref(),
        me,
        prompt::interactive(),
        &target.kind,
        &target.name,
        now,
    );
    match decision {
        Decision::Connect => Ok(true),
        Decision::ConnectWarning(message) => {
            eprintln!("{message}");
            Ok(true)
        }
        Decision::Ask(holder) => loop {
            let question = session::question(&holder, &target.kind, &target.name, now);
            let answer = tokio::task::spawn_blocking(move || read_answer(&question))
                .await
                .map_err(|e| CommandError::Failed(format!("cannot read the answer: {e}")))??;
            match answer {
                None | Some(Answer::No) => return Ok(false),
                Some(Answer::Yes) => return Ok(true),
                Some(Answer::Wait) => {
                    wait_until_free(cluster, target).await;
                    return Ok(true);
                }
                Some(Answer::Again) => continue,
            }
        },
    }
}

fn read_answer(question: &str) -> std::io::Result<Option<Answer>> {
    let mut err = std::io::stderr().lock();
    err.write_all(question.as_bytes())?;
    err.flush()?;
    drop(err);
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        eprintln!();
        return Ok(None);
    }
    Ok(Some(session::parse_answer(&line)))
}

/// Polls the holder every 2 s until the stream is free (d8's `w`).
async fn wait_until_free(cluster: &Cluster, target: &StreamTarget) {
    let kind = session::describe_kind(&target.kind);
    let mut frame = 0;
    while session::holder(cluster, target).await.is_some() {
        eprint!(
            "\r\x1b[K{} Waiting for the {kind} of {} to be released. Press Ctrl+C to exit.",
            SPINNER[frame % SPINNER.len()],
            target.name
        );
        frame += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if frame > 0 {
        eprint!("\r\x1b[K");
    }
}
